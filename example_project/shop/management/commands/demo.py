"""Tell the django-pgqueue story end to end, against the configured database.

Run ``migrate`` first. The demo enqueues jobs next to business writes (one of them in
a transaction that rolls back, one delayed, some that fail), runs the worker in burst
mode, waits for the retries the backoff scheduled, and prints every job's outcome.
It exits with an error if a job did not end as the story says it should.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from django.core.files.base import ContentFile
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone
from django.utils.timesince import timeuntil

import django_pgqueue
from django_pgqueue import Job, JobStatus
from shop.jobs import sync_to_crm
from shop.models import Album, Customer, Order, ProductPhoto
from shop.preview import sample_ppm
from shop.services import add_album, add_photo, place_order, sign_up

WORKER_COMMAND = "pgqueue_worker"


class CardDeclined(Exception):
    """The payment check of the sign-up that the demo rolls back."""


@dataclass
class Tracked:
    label: str
    job_id: Any
    expect_status: str
    expect_attempts: int


class Command(BaseCommand):
    help = (
        "Run the django-pgqueue demo: enqueue jobs inside transactions (one rolled back, "
        "one delayed, some failing), run `pgqueue_worker --burst`, and print the jobs. "
        "Run `migrate` first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=2,
            help="Jobs the worker runs at once (default: 2).",
        )
        parser.add_argument(
            "--max-wait",
            type=float,
            default=30.0,
            help="Longest wait, in seconds, for retries scheduled by backoff (default: 30).",
        )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="Only enqueue and print the jobs; do not run the worker.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.tracked: list[Tracked] = []
        self.heading("django-pgqueue demo")
        self.enqueue_story()
        if options["no_worker"]:
            self.show_jobs()
            return
        worker_ran = self.run_worker(options["concurrency"], options["max_wait"])
        self.show_jobs()
        if not worker_ran:
            raise CommandError(
                f"the {WORKER_COMMAND!r} management command is not available in this "
                "version of django_pgqueue, so the jobs above stay pending. Install a "
                "version that ships it, then run the demo again."
            )
        self.show_business_rows()
        self.check_outcomes()

    # -- the story ------------------------------------------------------------------

    def enqueue_story(self) -> None:
        self.step("1. Alice signs up: her row and her jobs are written in one transaction")
        alice, jobs = sign_up(_unused_email("alice"), "Alice")
        welcome, follow_up = jobs
        self.say(f"customer #{alice.pk} {alice.email}")
        self.show_enqueued(welcome, "due now")
        self.show_enqueued(follow_up, f"delayed: runs in {timeuntil(follow_up.run_at)}")
        self.track("alice: welcome email", welcome, JobStatus.COMPLETED, 1)
        self.track("alice: follow-up email (delayed)", follow_up, JobStatus.PENDING, 0)

        self.step("2. Mallory signs up, but her card is declined: the transaction rolls back")
        mallory_email = _unused_email("mallory")
        ghost_ids: list[Any] = []
        try:
            with transaction.atomic():
                mallory, jobs = sign_up(mallory_email, "Mallory")
                ghost_ids = [job.id for job in jobs]
                self.say(f"inside the transaction: customer #{mallory.pk} and jobs")
                for job in jobs:
                    self.show_enqueued(job, "")
                raise CardDeclined("card declined")
        except CardDeclined:
            pass
        ghost_jobs = Job.objects.filter(pk__in=ghost_ids).count()
        ghost_customers = Customer.objects.filter(email=mallory_email).count()
        self.say(
            f"after the rollback: {ghost_jobs} of those jobs and {ghost_customers} customer "
            "exist, so no worker will ever email Mallory"
        )
        if ghost_jobs or ghost_customers:
            raise CommandError("a rolled-back transaction left rows behind: this is a bug")

        self.step("3. Two product photos are uploaded; each enqueues a thumbnail job")
        mug, mug_job = add_photo("Red mug", ContentFile(sample_ppm(seed=1), name="red-mug.ppm"))
        vase, vase_job = add_photo(
            "Blue vase", ContentFile(sample_ppm(seed=2), name="blue-vase.ppm")
        )
        # The vase's file disappears before a worker gets to it: a permanent failure.
        vase.image.storage.delete(vase.image.name)
        self.show_enqueued(mug_job, f"photo #{mug.pk} {mug.image.name}")
        self.show_enqueued(vase_job, f"photo #{vase.pk}, whose file is then lost")
        self.track("red mug: thumbnail", mug_job, JobStatus.COMPLETED, 1)
        self.track("blue vase: thumbnail (file lost)", vase_job, JobStatus.FAILED, 1)

        self.step("4. Backfill: two imported customers are pushed to the CRM (priority 30)")
        bob = Customer.objects.create(email=_unused_email("bob"), name="Bob")
        carol = Customer.objects.create(email=_unused_email("carol"), name="Carol")
        bob_job, carol_job = django_pgqueue.enqueue_many(
            [
                {
                    "job_type": sync_to_crm.job_type,
                    "data": {"customer_id": bob.pk, "simulated_outage": 1},
                },
                {
                    "job_type": sync_to_crm.job_type,
                    "data": {"customer_id": carol.pk, "simulated_outage": 99},
                },
            ]
        )
        self.show_enqueued(bob_job, f"{bob.email}: the CRM is down for the first attempt")
        self.show_enqueued(carol_job, f"{carol.email}: the CRM stays down")
        self.track("bob: CRM sync (retried)", bob_job, JobStatus.COMPLETED, 2)
        self.track("carol: CRM sync (dead letter)", carol_job, JobStatus.FAILED, 3)

        self.step(
            "5. An album of three photos: their thumbnails side by side, then the album's "
            "cover from their results (a chord, one transaction)"
        )
        album, workflow = add_album(
            "Summer",
            [ContentFile(sample_ppm(seed=seed), name=f"summer-{seed}.ppm") for seed in (3, 4, 5)],
        )
        *thumbnails, cover = workflow.jobs
        for number, job in enumerate(thumbnails, 1):
            self.show_enqueued(job, f"album #{album.pk}, photo {number}")
            self.track(f"summer album: thumbnail {number}", job, JobStatus.COMPLETED, 1)
        self.show_enqueued(cover, f"{cover.status}: runs after the three thumbnails")
        self.track("summer album: cover (after the thumbnails)", cover, JobStatus.COMPLETED, 1)

        self.step(
            "6. Bob orders a mug: the checkout charges, emails the receipt, sleeps while "
            "the charge settles and records the sale in the CRM, which is down once"
        )
        order, checkout_job = place_order(bob, 1250, simulated_outage=1)
        self.show_enqueued(checkout_job, f"order #{order.pk}: durable steps, charged once")
        self.track("bob: checkout (durable steps)", checkout_job, JobStatus.COMPLETED, 2)

    def run_worker(self, concurrency: int, max_wait: float) -> bool:
        argv = ["--burst", "--concurrency", str(concurrency)]
        self.step(f"7. The worker: manage.py {WORKER_COMMAND} {' '.join(argv)}")
        if WORKER_COMMAND not in get_commands():
            self.say(self.style.ERROR(f"`{WORKER_COMMAND}` is not available (Unknown command)"))
            return False
        try:
            call_command(WORKER_COMMAND, *argv)
        except CommandError as exc:
            if "Unknown command" in str(exc):
                self.say(self.style.ERROR(f"`{WORKER_COMMAND}` is not available: {exc}"))
                return False
            raise
        # Failed attempts are retried after a backoff delay, and a sleeping job resumes
        # after its sleep; --burst exits once nothing is due, so wait for each and run
        # another burst.
        deadline = time.monotonic() + max_wait
        expected_later = [t.job_id for t in self.tracked if t.expect_status != JobStatus.PENDING]
        while True:
            later = (
                Job.objects.filter(pk__in=expected_later, status=JobStatus.PENDING)
                .order_by("run_at")
                .first()
            )
            if later is None:
                return True
            wait = max((later.run_at - timezone.now()).total_seconds(), 0.0)
            if time.monotonic() + wait > deadline:
                self.say(f"a job is due in {wait:.1f}s, past --max-wait: not waiting")
                return True
            when = f"due in {wait:.1f}s" if wait >= 0.05 else "due now"
            if later.attempts:
                why = (
                    f"attempt {later.attempts} failed ({_first_line(later.last_error)}); "
                    f"its retry is {when} (backoff)"
                )
            else:
                why = f"sleeps while the charge settles; it resumes {when}"
            self.say(f"{self.label(later)}: {why}, so the worker runs again")
            time.sleep(wait + 0.05)
            call_command(WORKER_COMMAND, *argv)

    # -- reporting ------------------------------------------------------------------

    def show_jobs(self) -> None:
        self.step("Jobs")
        jobs = Job.objects.in_bulk([t.job_id for t in self.tracked])
        rows = [("job", "status", "attempts", "progress", "stage", "outcome")]
        for tracked in self.tracked:
            job = jobs[tracked.job_id]
            rows.append(
                (
                    tracked.label,
                    job.status,
                    f"{job.attempts}/{job.max_attempts}",
                    f"{job.progress}%",
                    job.current_stage or "-",
                    _outcome(job),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for index, row in enumerate(rows):
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            line = "  ".join([*cells, row[-1]])
            self.stdout.write("  " + (self.style.MIGRATE_LABEL(line) if index == 0 else line))

    def show_business_rows(self) -> None:
        self.step("Business rows")
        for customer in Customer.objects.filter(pk__in=self.customer_ids()).order_by("pk"):
            done = [
                f"{name} {value:%H:%M:%S}"
                for name, value in (
                    ("welcomed", customer.welcomed_at),
                    ("followed up", customer.followed_up_at),
                    ("CRM synced", customer.crm_synced_at),
                )
                if value is not None
            ]
            self.say(f"customer {customer.email}: {', '.join(done) or 'nothing done yet'}")
        for photo in ProductPhoto.objects.filter(pk__in=self.photo_ids()).order_by("pk"):
            where = f" -> {photo.thumbnail.path}" if photo.thumbnail else ""
            self.say(f"photo {photo.title!r}: thumbnail {photo.thumbnail_status}{where}")
        for album in Album.objects.filter(pk__in=self._data_ids("album_id")).order_by("pk"):
            cover = album.cover.path if album.cover else "not built"
            self.say(f"album {album.title!r}: cover -> {cover}")
        for order in Order.objects.filter(pk__in=self._data_ids("order_id")).order_by("pk"):
            receipt = "receipt sent" if order.receipt_sent_at else "no receipt"
            crm = "sale in the CRM" if order.crm_recorded_at else "not in the CRM"
            self.say(
                f"order #{order.pk}: charged {order.charges} time(s) ({order.charge_id}), "
                f"{receipt}, {crm}"
            )

    def check_outcomes(self) -> None:
        jobs = Job.objects.in_bulk([t.job_id for t in self.tracked])
        wrong = [
            f"{t.label}: expected {t.expect_status} after {t.expect_attempts} attempts, got "
            f"{jobs[t.job_id].status} after {jobs[t.job_id].attempts}"
            for t in self.tracked
            if (jobs[t.job_id].status, jobs[t.job_id].attempts)
            != (t.expect_status, t.expect_attempts)
        ]
        if wrong:
            raise CommandError("the demo did not end as expected:\n  " + "\n  ".join(wrong))
        self.stdout.write("")
        self.stdout.write(
            self.style.SUCCESS(
                f"All {len(self.tracked)} jobs ended as expected; the rolled-back sign-up "
                "left no job behind."
            )
        )

    # -- helpers --------------------------------------------------------------------

    def track(self, label: str, job: Job, status: str, attempts: int) -> None:
        self.tracked.append(Tracked(label, job.id, str(status), attempts))

    def label(self, job: Job) -> str:
        return next((t.label for t in self.tracked if t.job_id == job.id), str(job.id))

    def customer_ids(self) -> set[int]:
        return self._data_ids("customer_id")

    def photo_ids(self) -> set[int]:
        return self._data_ids("photo_id")

    def _data_ids(self, key: str) -> set[int]:
        jobs = Job.objects.filter(pk__in=[t.job_id for t in self.tracked])
        return {job.data[key] for job in jobs if key in job.data}

    def heading(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(text))
        self.stdout.write(self.style.MIGRATE_HEADING("=" * len(text)))

    def step(self, text: str) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(text))

    def say(self, text: str) -> None:
        self.stdout.write(f"  {text}")

    def show_enqueued(self, job: Job, note: str) -> None:
        self.say(f"+ job {job.id}  {job.job_type:<26}{note}".rstrip())


def _unused_email(local: str) -> str:
    """``local@example.com``, or ``local+N@example.com`` when the demo ran before."""
    email = f"{local}@example.com"
    number = 1
    while Customer.objects.filter(email=email).exists():
        number += 1
        email = f"{local}+{number}@example.com"
    return email


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _outcome(job: Job) -> str:
    if job.status == JobStatus.PENDING:
        if job.run_at > timezone.now():
            return f"runs in {timeuntil(job.run_at)}"
        return "due now"
    if job.status == JobStatus.FAILED:
        return _shorten(_first_line(job.last_error), 80)
    if job.status == JobStatus.COMPLETED and job.result is not None:
        return _shorten(json.dumps(job.result), 80)
    return ""


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
