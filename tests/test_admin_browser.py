"""The jobs admin in a real browser: headless Chromium, driven by Playwright, against
pytest-django's live server, with a real worker running the jobs.

The browser is Debian's ``/usr/bin/chromium`` (``apt-get install chromium``), never one
downloaded by ``playwright install``. Without it, or without the ``playwright`` package,
these tests are skipped, except under CI (``CI=true``), where they fail.

The tests take the screenshots shown in the docs. They go to a temporary directory, or
to ``$PGQUEUE_SCREENSHOTS`` when set: ``PGQUEUE_SCREENSHOTS=docs/img make test
PYTEST_ARGS="-m browser"`` refreshes the docs' images.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.admin import charts, overview
from django_pgqueue.models import Job, QueueMinute, WorkerRecord
from django_pgqueue.rollups import recount

from .availability import unavailable
from .workers import ROOT, wait_for, worker_thread

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
]
PASSWORD = "correct horse battery staple"
TIMEOUT_MS = 15_000

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def _async_unsafe_allowed() -> Iterator[None]:
    # Playwright's sync API runs an event loop in the test's thread, and Django refuses
    # ORM calls from a thread with a running loop. Each thread here still uses only its
    # own connections, which is what that check protects.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def browser(_async_unsafe_allowed: None) -> Iterator[Any]:
    if not CHROMIUM.exists():
        unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is missing (pip install playwright)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1760, "height": 760})
    # The admin's navigation sidebar closed, as its toggle leaves it: wider tables.
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    yield page
    context.close()


@pytest.fixture
def screenshot(tmp_path: Path) -> Callable[..., Path]:
    """``screenshot(page, "name.png")``: into $PGQUEUE_SCREENSHOTS, else a temp dir."""
    directory = Path(os.environ.get("PGQUEUE_SCREENSHOTS") or tmp_path)
    directory = directory if directory.is_absolute() else ROOT / directory
    directory.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str, *, full_page: bool = False) -> Path:
        path = directory / name
        page.screenshot(path=str(path), full_page=full_page)
        assert path.stat().st_size > 0
        return path

    return take


@pytest.fixture
def staff(django_user_model: Any) -> Callable[..., str]:
    """Create a staff user with the given permissions; returns the username."""

    def make(username: str, *codenames: str) -> str:
        user = django_user_model.objects.create_user(
            username=username, password=PASSWORD, is_staff=True
        )
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="django_pgqueue", codename__in=codenames
            )
        )
        return username

    return make


def log_in(page: Any, username: str) -> None:
    """Log in through the admin's login form; lands on the jobs changelist."""
    changelist = reverse("admin:django_pgqueue_job_changelist")
    page.goto(f"{reverse('admin:login')}?next={changelist}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"**{changelist}")


def live(page: Any, job: Job, field: str) -> Any:
    return page.locator(f'[data-pgqueue-job="{job.pk}"][data-pgqueue-field="{field}"]')


def mark_page(page: Any) -> None:
    """Mark the loaded document; ``page_was_reloaded`` tells whether it was replaced."""
    page.evaluate("window.pgqueueTestMark = true")


def page_was_reloaded(page: Any) -> bool:
    return page.evaluate("window.pgqueueTestMark !== true")


def reloaded_by_itself(page: Any) -> bool:
    """Whether the marked page was replaced; ``False`` while it is being replaced."""
    try:
        return page_was_reloaded(page)
    except Exception:  # the old document is gone, the new one not there yet
        return False


def scenery(make_job: Callable[..., Job]) -> None:
    """Jobs in every other state, as a shop would have them, for realistic pages."""
    now = timezone.now()
    make_job(
        job_type="shop.send_welcome_email",
        queue="emails",
        status="completed",
        progress=100,
        attempts=1,
        worker_id="web-1:4242:9f3a1c",
        created_at=now - timedelta(minutes=12),
        started_at=now - timedelta(minutes=12),
        completed_at=now - timedelta(minutes=12) + timedelta(seconds=2),
        data={"customer_id": 1042},
    )
    make_job(
        job_type="shop.make_thumbnail",
        queue="images",
        status="failed",
        progress=40,
        current_stage="resizing",
        attempts=3,
        worker_id="web-1:4242:9f3a1c",
        created_at=now - timedelta(minutes=9),
        started_at=now - timedelta(minutes=8),
        completed_at=now - timedelta(minutes=8) + timedelta(seconds=3),
        last_error="OSError: cannot identify image file 'photo-77.heic'",
        data={"photo_id": 77},
    )
    make_job(
        job_type="shop.sync_crm",
        queue="default",
        status="cancelled",
        attempts=0,
        created_at=now - timedelta(minutes=6),
        completed_at=now - timedelta(minutes=5),
        data={"customer_id": 1043},
    )
    make_job(
        job_type="shop.send_follow_up_email",
        queue="emails",
        status="pending",
        created_at=now - timedelta(minutes=3),
        run_at=now + timedelta(days=1),
        data={"customer_id": 1042},
    )


# -- tests --------------------------------------------------------------------------------


def test_the_changelist_shows_a_running_jobs_progress_bar_advance(
    page, staff, make_job, screenshot
):
    scenery(make_job)
    job = enqueue("tests.progress", {"sleep": 1.0, "report_id": 7})
    log_in(page, staff("watcher", "view_job"))
    mark_page(page)
    bar, status = live(page, job, "progress"), live(page, job, "status")
    assert (bar.get_attribute("aria-valuenow"), status.inner_text()) == ("0", "Pending")

    seen: list[tuple[int, float, str]] = []
    shot = False
    deadline = time.monotonic() + 20
    with worker_thread(concurrency=1, job_types=["tests.progress"]):
        while not seen or seen[-1][2] != "Completed":
            assert time.monotonic() < deadline, f"the page never showed it completed: {seen[-5:]}"
            percent = int(bar.get_attribute("aria-valuenow"))
            width = bar.locator(".pgqueue-progress-fill").evaluate(
                "el => el.getBoundingClientRect().width"
            )
            seen.append((percent, width, status.inner_text()))
            if 0 < percent < 100 and not shot:
                page.wait_for_timeout(450)  # the bar's CSS transition
                screenshot(page, "admin-changelist.png")
                shot = True
            page.wait_for_timeout(100)

    percents = [percent for percent, _, _ in seen]
    # The page showed the job part-way, at more than one step, and never went backwards.
    assert len({25, 50, 75} & set(percents)) >= 2, percents
    assert percents == sorted(percents) and percents[-1] == 100
    widths = [width for _, width, _ in seen]
    assert widths == sorted(widths) and widths[0] == 0 and widths[-1] > 0
    assert "Running" in {text for _, _, text in seen}
    assert not page_was_reloaded(page)


def test_a_failed_job_retried_from_the_changelist_runs_to_completion(page, staff, make_job):
    job = make_job(
        job_type="tests.progress",
        data={"sleep": 0.3},
        status="failed",
        attempts=3,
        max_attempts=3,
        last_error="RuntimeError: boom",
        completed_at=timezone.now(),
    )
    log_in(page, staff("operator", "view_job", "retry_job"))

    page.check(f'input[name="_selected_action"][value="{job.pk}"]')
    page.select_option('select[name="action"]', "retry_jobs")
    page.locator('.actions button[name="index"]').first.click()  # "Go" ("Run" on Django 6)

    messages = page.locator(".messagelist")
    messages.get_by_text("Retry: 1 changed, 0 skipped").wait_for()
    status = live(page, job, "status")
    assert status.inner_text() == "Pending"
    mark_page(page)
    with worker_thread(concurrency=1, job_types=["tests.progress"]):
        page.wait_for_function(
            f"""() => document.querySelector(
                '[data-pgqueue-job="{job.pk}"][data-pgqueue-field="status"]'
            ).textContent === "Completed" """,
            timeout=TIMEOUT_MS,
        )
    assert live(page, job, "attempts").inner_text() == "1 / 3"
    assert live(page, job, "progress").get_attribute("aria-valuenow") == "100"
    assert not page_was_reloaded(page)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("completed", 1)


def test_a_job_page_shows_progress_and_stage_history_live(page, staff, screenshot):
    job = enqueue("tests.progress", {"sleep": 0.5, "report_id": 7})
    log_in(page, staff("watcher", "view_job"))
    page.goto(reverse("admin:django_pgqueue_job_change", args=[job.pk]))
    mark_page(page)
    rows = page.locator(".pgqueue-history-table tbody tr")
    assert rows.all_inner_texts() == ["No progress reported yet."]

    with worker_thread(concurrency=1, job_types=["tests.progress"]):
        page.wait_for_function(
            """() => document.querySelectorAll(".pgqueue-history-table tbody tr").length === 4
                && document.querySelector('[data-pgqueue-field="status"]').textContent
                   === "Completed" """,
            timeout=TIMEOUT_MS,
        )

    stages = [text.split("\t")[1:] for text in rows.all_inner_texts()]
    assert stages == [
        ["1", "25%", "step 1"],
        ["1", "50%", "step 2"],
        ["1", "75%", "step 3"],
        ["1", "100%", "step 4"],
    ]
    assert live(page, job, "stage").inner_text() == "step 4"
    assert not page_was_reloaded(page)
    page.reload()  # every field final, for the docs' picture
    screenshot(page, "admin-job.png", full_page=True)


def test_the_queue_overview_shows_queues_and_workers(page, staff, make_job, screenshot):
    scenery(make_job)
    for _ in range(3):
        make_job(
            job_type="shop.send_welcome_email",
            queue="emails",
            status="completed",
            completed_at=timezone.now(),
        )
    make_job(job_type="shop.make_thumbnail", queue="images", run_at=timezone.now())
    recount(timezone.now() - timedelta(hours=1))  # the rollups workers write each minute
    log_in(page, staff("watcher", "view_job"))

    with worker_thread(concurrency=2, queues=["reports"]) as worker:
        wait_for(lambda: WorkerRecord.objects.filter(worker_id=worker.worker_id).exists())
        page.get_by_role("link", name="Queue overview").click()
        page.wait_for_url("**/overview/")

        queues = page.locator("#pgqueue-queues tbody tr th")
        # default's only job was cancelled 5 minutes ago: the last day counts it.
        assert queues.all_inner_texts() == ["default", "emails", "images"]
        emails = page.locator("#pgqueue-queues tbody tr", has_text="emails")
        assert emails.locator(".pgqueue-completed-last-minute").inner_text() == "3"
        assert emails.locator(".pgqueue-completed-last-hour").inner_text() == "1"  # 12 min ago
        images = page.locator("#pgqueue-queues tbody tr", has_text="images")
        assert images.locator(".pgqueue-failed-last-hour").inner_text() == "1"
        workers = page.locator("#pgqueue-workers tr.pgqueue-worker-row")
        assert "alive" in workers.filter(has_text=worker.worker_id).inner_text()
        screenshot(page, "admin-overview.png")


def test_a_workers_page_shows_what_it_serves_and_the_job_it_runs(page, staff, screenshot):
    job = enqueue("tests.progress", {"sleep": 1.0, "report_id": 7})
    log_in(page, staff("watcher", "view_job"))

    with worker_thread(concurrency=2, queues=["default"], job_types=["tests.progress"]) as worker:
        wait_for(lambda: Job.objects.filter(pk=job.pk, progress__gt=0).exists())
        page.goto(reverse("admin:django_pgqueue_job_overview"))
        page.get_by_role("link", name=worker.worker_id).click()
        page.wait_for_url(f"**/{worker.worker_id}/")

        def fact(name: str) -> str:
            header = page.get_by_role("rowheader", name=name, exact=True)
            return page.locator("#pgqueue-worker tr", has=header).locator("td").inner_text()

        assert fact("State").startswith("alive")
        assert fact("Queues") == "default"
        assert fact("Job types") == "tests.progress"
        assert "ago" in fact("Last heartbeat")
        held = page.locator("#pgqueue-worker-jobs tr.pgqueue-worker-job")
        assert held.count() == 1
        assert "tests.progress\tdefault\tRunning" in held.inner_text()
        screenshot(page, "admin-worker.png")
        held.get_by_role("link").click()
        page.wait_for_url(f"**/{job.pk}/change/")


def test_the_changelist_fits_a_1280_pixel_wide_window(page, staff, make_job):
    scenery(make_job)
    log_in(page, staff("watcher", "view_job"))
    page.set_viewport_size({"width": 1280, "height": 760})
    page.reload()

    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")

    assert overflow <= 0, f"the job list is {overflow}px wider than a 1280px window"


def test_the_charts_draw_the_rollups_and_narrow_to_a_span(page, staff, make_job, screenshot):
    scenery(make_job)
    now = timezone.now()
    for minutes in range(1, 50):
        for _ in range(minutes % 7 + 1):
            make_job(
                job_type="shop.send_welcome_email",
                queue="emails",
                status="completed" if minutes % 11 else "failed",
                run_at=now - timedelta(minutes=minutes, seconds=3),
                started_at=now - timedelta(minutes=minutes, seconds=minutes % 3),
                completed_at=now - timedelta(minutes=minutes),
            )
    recount(now - timedelta(hours=1))
    minute = now.replace(second=0, microsecond=0)
    QueueMinute.objects.bulk_create(
        QueueMinute(
            minute=minute - timedelta(minutes=k),
            depths={"emails": {"pending": 40 - k % 30, "scheduled": 3, "running": 2, "waiting": 0}},
        )
        for k in range(50)
    )
    log_in(page, staff("watcher", "view_job"))

    page.get_by_role("link", name="Charts").click()
    page.wait_for_url("**/charts/")

    figures = page.locator("figure.pgqueue-figure")
    assert figures.count() == 4
    finished = figures.filter(has_text="Jobs finished, per minute")
    assert finished.locator("polyline").count() >= 2  # completed and failed, with data
    assert "No rollups" not in page.locator("#content-main").inner_text()
    screenshot(page, "admin-charts.png", full_page=True)

    page.get_by_role("link", name="Day").click()
    page.wait_for_url("**/charts/?span=day")
    assert "Jobs finished, per 15 minutes" in page.locator("#content-main").inner_text()
    page.select_option("select[name=queue]", "emails")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**queue=emails**")
    assert page.locator("figure.pgqueue-figure").count() == 4


def test_staff_add_a_schedule_then_pause_it_from_the_periodic_page(page, staff, screenshot):
    log_in(
        page,
        staff("planner", "view_job", "retry_job", "add_storedschedule", "change_storedschedule"),
    )

    page.get_by_role("link", name="Periodic jobs").click()
    page.get_by_role("link", name="Add a schedule").click()
    page.fill("#id_name", "nightly-export")
    page.select_option("#id_job_type", "tests.noop")
    page.fill("#id_schedule", "0 3 * * *")
    page.fill("#id_timezone", "Mars/Olympus")
    page.get_by_role("button", name="Save", exact=True).click()
    assert "must be an IANA time zone name" in page.locator(".errorlist").inner_text()
    page.fill("#id_timezone", "Europe/Paris")
    page.get_by_role("button", name="Save", exact=True).click()
    page.wait_for_url("**/storedschedule/")

    page.goto(reverse("admin:django_pgqueue_job_periodic"))
    row = page.locator("tr.pgqueue-schedule", has_text="nightly-export")
    assert "the admin (stored)" in row.inner_text()
    row.get_by_role("button", name="Pause").click()
    page.wait_for_url("**/periodic/")
    assert "Periodic job “nightly-export” paused" in page.locator(".messagelist").inner_text()
    row = page.locator("tr.pgqueue-schedule", has_text="nightly-export")
    assert "Paused" in row.inner_text()
    assert row.get_by_role("button", name="Resume").is_visible()
    screenshot(page, "admin-periodic.png")


def test_the_errors_page_groups_failures_and_links_to_them(page, staff, make_job, screenshot):
    scenery(make_job)
    now = timezone.now()
    for n in range(3):
        make_job(
            job_type="shop.charge_card",
            queue="payments",
            status="failed",
            attempts=3,
            completed_at=now - timedelta(minutes=n),
            last_error=f"payments.GatewayTimeout: no answer from the gateway in 30s (order {n})",
        )
    log_in(page, staff("watcher", "view_job"))

    page.get_by_role("link", name="Errors").click()
    page.wait_for_url("**/errors/")

    group = page.locator("tr.pgqueue-error-group", has_text="GatewayTimeout")
    assert "3" in group.inner_text()
    screenshot(page, "admin-errors.png")
    group.get_by_role("link", name="3").click()
    page.wait_for_url("**error=payments.GatewayTimeout**")
    assert page.locator("#result_list tbody tr").count() == 3


def test_the_overview_and_the_charts_reload_themselves(page, staff, make_job, monkeypatch):
    monkeypatch.setattr(charts, "REFRESH_SECONDS", 1)
    monkeypatch.setattr(overview, "REFRESH_SECONDS", 1)
    log_in(page, staff("watcher", "view_job"))

    page.goto(reverse("admin:django_pgqueue_job_charts"))
    assert page.locator("figure.pgqueue-figure polyline").count() == 0  # no rollups yet
    mark_page(page)
    now = timezone.now()
    make_job(queue="emails", status="completed", completed_at=now - timedelta(minutes=2))
    recount(now - timedelta(minutes=5))
    wait_for(lambda: reloaded_by_itself(page), timeout=10)
    page.wait_for_selector("figure.pgqueue-figure polyline", state="attached")

    page.goto(reverse("admin:django_pgqueue_job_overview"))
    assert page.locator("#pgqueue-queues tbody tr th").all_inner_texts() == ["emails"]
    mark_page(page)
    make_job(queue="images", run_at=timezone.now())
    wait_for(lambda: reloaded_by_itself(page), timeout=10)
    page.wait_for_selector("#pgqueue-queues tbody tr th:has-text('images')")
