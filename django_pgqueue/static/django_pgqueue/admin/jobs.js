/*
 * django-pgqueue admin: live refresh of job progress on the changelist and job pages.
 *
 * Elements carrying data-pgqueue-job and data-pgqueue-field are updated from the JSON
 * endpoint named by data-pgqueue-live-url, polled every data-pgqueue-interval ms while
 * one of the jobs on the page is not finished, and paused while the tab is hidden.
 * Plain JavaScript, no dependencies.
 */
(function () {
  "use strict";

  var FINISHED = ["completed", "failed", "cancelled"];
  var MAX_FAILURES = 5;

  function start() {
    var config = document.querySelector("[data-pgqueue-live-url]");
    if (!config) {
      return;
    }
    var url = config.getAttribute("data-pgqueue-live-url");
    var interval = parseInt(config.getAttribute("data-pgqueue-interval"), 10) || 1000;
    var historyId = config.getAttribute("data-pgqueue-history");
    var failures = 0;
    var timer = null;

    function unfinishedIds() {
      var ids = [];
      document.querySelectorAll('[data-pgqueue-field="status"]').forEach(function (el) {
        var id = el.getAttribute("data-pgqueue-job");
        if (FINISHED.indexOf(el.getAttribute("data-pgqueue-status")) === -1 && ids.indexOf(id) === -1) {
          ids.push(id);
        }
      });
      return ids;
    }

    function text(el, value) {
      el.textContent = value === null || value === undefined || value === "" ? "-" : String(value);
    }

    function time(el, value) {
      text(el, value[el.getAttribute("data-pgqueue-format") || "full"]);
      el.title = value.full;
    }

    function setProgress(el, job) {
      el.className = "pgqueue-progress pgqueue-progress-" + job.status;
      el.setAttribute("aria-valuenow", String(job.progress));
      el.querySelector(".pgqueue-progress-fill").style.width = job.progress + "%";
      el.querySelector(".pgqueue-progress-percent").textContent = job.progress + "%";
      el.querySelector(".pgqueue-progress-stage").textContent = job.current_stage;
    }

    function apply(job) {
      document.querySelectorAll('[data-pgqueue-job="' + job.id + '"]').forEach(function (el) {
        switch (el.getAttribute("data-pgqueue-field")) {
          case "status":
            el.className = "pgqueue-status pgqueue-status-" + job.status;
            el.setAttribute("data-pgqueue-status", job.status);
            el.textContent = job.status_label;
            break;
          case "progress":
            setProgress(el, job);
            break;
          case "stage":
            text(el, job.current_stage);
            break;
          case "attempts":
            el.textContent = job.attempts + " / " + job.max_attempts;
            break;
          case "worker":
            text(el, job.worker_id);
            el.title = job.worker_id || "";
            break;
          case "started":
            time(el, job.started_at);
            break;
          case "completed":
            time(el, job.completed_at);
            break;
          case "last_error":
            el.textContent = job.last_error;
            break;
          case "history":
            el.querySelector(".pgqueue-history-total").textContent = String(job.events_count);
            break;
        }
      });
    }

    function renderHistory(events) {
      var body = document.querySelector('[data-pgqueue-field="history"] tbody');
      if (!body || !events.length) {
        return;
      }
      var rows = document.createDocumentFragment();
      events.forEach(function (event) {
        var row = document.createElement("tr");
        [event.created_at, event.attempt, event.progress + "%", event.stage].forEach(function (value) {
          var cell = document.createElement("td");
          cell.textContent = value;
          row.appendChild(cell);
        });
        rows.appendChild(row);
      });
      body.replaceChildren(rows);
      document.querySelectorAll(".pgqueue-history-shown").forEach(function (el) {
        el.textContent = String(events.length);
      });
    }

    function schedule(delay) {
      clearTimeout(timer);
      timer = setTimeout(poll, delay);
    }

    function poll() {
      timer = null;
      if (document.hidden) {
        return; // resumed by the visibilitychange handler
      }
      var ids = unfinishedIds();
      if (!ids.length) {
        return; // everything on the page is finished: nothing can change by itself
      }
      var query = ids.map(function (id) { return "id=" + encodeURIComponent(id); });
      if (historyId) {
        query.push("history=" + encodeURIComponent(historyId));
      }
      fetch(url + "?" + query.join("&"), {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      })
        .then(function (response) {
          var type = response.headers.get("Content-Type") || "";
          // A logged-out session is redirected to the login page: HTML, not JSON.
          if (!response.ok || type.indexOf("application/json") === -1) {
            throw new Error("live refresh failed: HTTP " + response.status);
          }
          return response.json();
        })
        .then(function (data) {
          failures = 0;
          data.jobs.forEach(apply);
          if (data.history) {
            renderHistory(data.history);
          }
          schedule(interval);
        })
        .catch(function () {
          failures += 1;
          if (failures < MAX_FAILURES) {
            schedule(interval * Math.pow(2, failures));
          }
        });
    }

    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && timer === null) {
        poll();
      }
    });
    schedule(interval);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
