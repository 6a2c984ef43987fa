"""The web page's Workers, Periodic and Batches pages, the actions on a waiting job (cancel,
retry now, reschedule) and the bulk actions on a filtered list, in a real headless Chromium
(Debian's ``chromium`` driven by Playwright, as in ``test_web_browser.py``) served by uvicorn
against each backend's database — each action's effect read back from the database. And the
refresh: the overview and the lists update in place, a header button pauses and resumes it
(Playwright's clock drives the page's timers: no test waits out an interval), and a list
where the operator has ticked jobs is not swapped under their hand.

``SQLQUEUE_SCREENSHOTS=1`` writes the pages' screenshots into ``docs/screenshots/``.
"""

from __future__ import annotations

import re
from datetime import UTC, timedelta
from typing import Any

import sqlqueue
from sqlqueue.web import create_app
from tests import test_web_browser
from tests._support import drain, enqueue, wait_until
from tests._support.web import populated, serving
from tests.apps.processes import Workers
from tests.conftest import Backend
from tests.test_web_browser import outside_the_browser_loop, shoot

# The browser and a fresh tab, as the other browser tests have them.
chromium = test_web_browser.chromium
page = test_web_browser.page
pytestmark = test_web_browser.BROWSER


def test_the_workers_page_lists_each_live_worker_process(
    backend: Backend, page: Any, workers: Workers
) -> None:
    from playwright.sync_api import expect

    started = [workers.start("--concurrency", str(slots)) for slots in (2, 3)]
    queue = backend.queue()

    def both() -> list[sqlqueue.WorkerInfo] | None:
        found = queue.workers()
        return found if len(found) == 2 else None

    live = wait_until(
        both,
        timeout=60,
        what="two workers to announce themselves",
    )
    with serving(create_app(queue)) as base:
        page.goto(base + "/workers")
        expect(page.locator("h1")).to_have_text("Workers")
        rows = page.locator("#workers tbody tr")
        expect(rows).to_have_count(2)
        for worker in live:
            row = page.locator(f'#workers tr[data-worker-id="{worker.id}"]')
            expect(row.locator(".host")).to_have_text(worker.host)
            expect(row.locator(".pid")).to_have_text(str(worker.pid))
            expect(row.locator(".version")).to_have_text(worker.version)
            expect(row.locator(".state")).to_contain_text("alive")
            for name, slots in worker.queues.items():
                expect(row.locator(".queues")).to_contain_text(f"{name} ({slots})")
        assert sorted(worker.pid for worker in live) == sorted(p.popen.pid for p in started)
        shoot(page, "workers.png")
        page.goto("about:blank")


def scheduled(backend: Backend) -> tuple[sqlqueue.Queue, dict[str, int]]:
    """Two schedules whose last slots were enqueued by a scheduler pass; a burst worker ran
    them: the report succeeded, the sync died."""
    from sqlqueue._worker.scheduler import Scheduler

    queue = backend.queue()

    @queue.periodic("*/5 * * * *", "reports.rollup")
    def rollup() -> None:
        return None

    @queue.periodic("0 3 * * *", "crm.nightly_sync", timezone="Europe/Paris", max_attempts=1)
    def nightly() -> None:
        raise ConnectionError("CRM refused the connection")

    @queue.periodic("0 9 * * 1", "mail.weekly_digest", missed="skip")
    def digest() -> None:
        return None

    Scheduler(queue, queue.periodic_schedules).run_once()
    drain(queue)
    now = queue.database_now()
    by_task = {}
    for schedule in queue.periodic_schedules:
        found = queue.jobs(idempotency_key=schedule.key(schedule.latest_slot(now)), limit=1)
        if found:
            by_task[schedule.task] = found[0].id
    return queue, by_task


def test_the_periodic_page_shows_each_schedule_its_next_slot_and_its_last_slots_job(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue, by_task = outside_the_browser_loop(scheduled, backend)
    assert set(by_task) == {"reports.rollup", "crm.nightly_sync"}  # the weekly slot is skipped
    with serving(create_app(queue)) as base:
        page.goto(base + "/")
        page.get_by_role("link", name="Periodic", exact=True).click()
        expect(page.locator("h1")).to_have_text("Periodic jobs")
        expect(page.locator("#schedules tbody tr")).to_have_count(3)
        now = queue.database_now()
        for schedule in queue.periodic_schedules:
            row = page.locator(f'#schedules tr[data-task="{schedule.task}"]')
            expect(row.locator("code.cron")).to_have_text(schedule.cron)
            expect(row.locator(".tz")).to_have_text(schedule.timezone)
            upcoming = schedule.next_slot(now).strftime("%Y-%m-%d %H:%M:%S")
            expect(row.locator(".next-slot")).to_contain_text(upcoming)
            if schedule.timezone != "UTC":  # and in UTC, as every other time on the page
                in_utc = schedule.next_slot(now).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                expect(row.locator(".next-slot")).to_contain_text(f"({in_utc})")
        rollup = page.locator('#schedules tr[data-task="reports.rollup"] .last-job')
        expect(rollup).to_contain_text(f"#{by_task['reports.rollup']}")
        expect(rollup.locator(".status")).to_have_text("succeeded")
        nightly = page.locator('#schedules tr[data-task="crm.nightly_sync"] .last-job')
        expect(nightly.locator(".status")).to_have_text("dead")
        weekly = page.locator('#schedules tr[data-task="mail.weekly_digest"] .last-job')
        expect(weekly).to_contain_text("not enqueued (missed slots are skipped)")
        shoot(page, "periodic.png")
        nightly.locator("a").click()
        expect(page.locator("h1")).to_contain_text(f"Job #{by_task['crm.nightly_sync']}")
        page.goto("about:blank")


def batched(backend: Backend) -> tuple[sqlqueue.Queue, sqlqueue.Batch]:
    """A batch of five exports, one of which dies, with a callback; run by a burst worker."""
    queue = backend.queue()

    @queue.task("exports.render_page", max_attempts=1)
    def render(page: int) -> None:
        if page == 3:
            raise ValueError("page 3 has no rows")

    @queue.task("exports.notify")
    def notify() -> None:
        return None

    with queue.engine.begin() as conn:
        queue.enqueue_batch(  # an older batch
            conn, [sqlqueue.JobRequest(job_type="exports.render_page", payload={"page": 0})]
        )
    drain(queue)
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(
            conn,
            [
                sqlqueue.JobRequest(job_type="exports.render_page", payload={"page": n})
                for n in range(1, 6)
            ],
            on_complete=sqlqueue.JobRequest(job_type="exports.notify"),
        )
    drain(queue)
    return queue, batch


def test_the_batches_list_and_a_batchs_page_show_its_counts_and_children(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue, batch = outside_the_browser_loop(batched, backend)
    status = queue.get_batch(batch.id)
    assert status is not None
    assert (status.succeeded, status.dead, status.finished) == (4, 1, True)
    with serving(create_app(queue)) as base:
        page.goto(base + "/")
        page.get_by_role("link", name="Batches", exact=True).click()
        rows = page.locator("#batches tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.first).to_have_attribute("data-batch-id", str(batch.id))  # newest first
        row = page.locator(f'#batches tr[data-batch-id="{batch.id}"]')
        expect(row.locator('[data-count="succeeded"]')).to_have_text("4")
        expect(row.locator('[data-count="dead"]')).to_have_text("1")
        expect(row.locator("svg.bar rect")).to_have_count(2)
        shoot(page, "batches.png")

        row.get_by_role("link", name=f"#{batch.id}").click()
        expect(page.locator("h1")).to_contain_text(f"Batch #{batch.id}")
        expect(page.locator("h1 .badge")).to_have_text("finished")
        expect(page.locator("#batch-counts")).to_contain_text("5 of 5 jobs ended")
        expect(page.locator("#batch-counts")).to_contain_text(f"#{status.callback_job_id}")
        expect(page.locator("#jobs tbody tr")).to_have_count(6)  # and the callback
        expect(page.locator("#jobs")).to_contain_text("page 3 has no rows")
        shoot(page, "batch.png")
        page.locator(f'#jobs a[href$="/jobs/{batch.job_ids[2]}"]').click()
        page.locator("#batch a").first.click()
        expect(page).to_have_url(re.compile(rf"/batches/{batch.id}$"))
        page.goto("about:blank")


def test_cancel_retry_now_and_reschedule_from_a_jobs_page(backend: Backend, page: Any) -> None:
    from playwright.sync_api import expect

    queue, ids = outside_the_browser_loop(populated, backend)
    failed, queued, other = ids["failed"][0], ids["queued"][0], ids["queued"][1]
    app = create_app(queue, current_user=lambda request: "ada")
    with serving(app) as base:
        # Retry now: the failed job waiting an hour for its retry is due at once.
        page.goto(f"{base}/jobs/{failed}")
        expect(page.locator("#waiting-actions h2")).to_have_text("This job waits for a retry")
        shoot(page, "job_actions.png")
        page.get_by_label("reason to retry now").fill("the endpoint is back")
        page.get_by_role("button", name="Retry now").click()
        expect(page.locator("#retried")).to_contain_text("due now")
        expect(page.locator("#history tr[data-action='run_now']")).to_contain_text("ada")
        job = queue.get_job(failed)
        assert job is not None
        assert job.next_run_at <= queue.database_now()
        assert (job.status, job.attempts) == (sqlqueue.JobStatus.FAILED, 1)

        # Reschedule, two hours from now.
        page.goto(f"{base}/jobs/{queued}")
        page.get_by_label("new run time").fill("+2h")
        page.get_by_label("reason to reschedule").fill("after the deploy")
        before = queue.database_now()
        page.get_by_role("button", name="Reschedule").click()
        history = page.locator("#history tr[data-action='reschedule']")
        expect(history).to_contain_text("after the deploy")
        job = queue.get_job(queued)
        assert job is not None
        assert before + timedelta(hours=2) <= job.next_run_at
        assert job.next_run_at <= queue.database_now() + timedelta(hours=2)

        # Cancel.
        page.goto(f"{base}/jobs/{other}")
        page.get_by_label("reason to cancel").fill("sent by hand instead")
        page.get_by_role("button", name="Cancel", exact=True).click()
        expect(page.locator("h1 .status")).to_have_text("cancelled")
        expect(page.locator("#waiting-actions")).to_have_count(0)
        expect(page.locator("#history tr[data-action='cancel']")).to_contain_text("sent by hand")
        job = queue.get_job(other)
        assert job is not None
        assert job.status is sqlqueue.JobStatus.CANCELLED
        assert [(a.action, a.by) for a in queue.job_actions(other)] == [("cancel", "ada")]
        page.goto("about:blank")


def test_a_run_time_in_the_past_is_refused_with_the_reason_and_changes_nothing(
    backend: Backend, chromium: Any
) -> None:
    from playwright.sync_api import expect

    queue, ids = outside_the_browser_loop(populated, backend)
    queued = ids["queued"][0]
    before = queue.get_job(queued)
    context = chromium.new_context()  # not the page fixture: the 400 logs a console error
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    with serving(create_app(queue)) as base:
        tab.goto(f"{base}/jobs/{queued}")
        tab.get_by_label("new run time").fill("2020-01-01 08:00")
        tab.get_by_label("reason to reschedule").fill("after the deploy")
        tab.get_by_role("button", name="Reschedule").click()
        expect(tab.locator("h1")).to_have_text("400")
        expect(tab.locator(".message")).to_contain_text("2020-01-01 08:00:00 UTC is in the past")
        expect(tab.locator(".message")).to_contain_text("use Retry now")
    context.close()
    assert queue.get_job(queued) == before
    assert queue.job_actions(queued) == []


def test_bulk_requeue_of_ticked_jobs_and_bulk_cancel_of_every_match(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue, ids = outside_the_browser_loop(populated, backend)
    app = create_app(queue, current_user=lambda request: "grace")
    with serving(app) as base:
        # Tick two of the three dead crm.sync jobs, requeue them.
        page.goto(f"{base}/jobs?status=dead&type=crm.sync")
        expect(page.locator("#jobs tbody tr")).to_have_count(3)
        chosen = ids["dead_503"]
        for job_id in chosen:
            page.get_by_label(f"pick job {job_id}").check()
        page.get_by_role("button", name="Requeue…").click()
        expect(page.locator("h1")).to_have_text("Requeue 2 jobs?")
        shoot(page, "bulk_confirm.png")
        page.get_by_label("reason to requeue them").fill("CRM is back")
        page.get_by_role("button", name="Yes, requeue 2 jobs").click()
        expect(page.locator(".notice")).to_have_text("Requeued 2 dead job(s) as new jobs.")
        for job_id in chosen:
            job = queue.get_job(job_id)
            assert job is not None
            assert (job.requeued_by, job.requeue_reason) == ("grace", "CRM is back")
        spared = queue.get_job(ids["dead_410"][0])
        assert spared is not None
        assert spared.requeued_as is None

        # Every queued mail.send job, on every page: the confirmation states how many.
        waiting = queue.count_jobs(job_type="mail.send", status="queued")
        page.goto(f"{base}/jobs?type=mail.send")
        page.get_by_label("every job matching the filter").check()
        page.get_by_role("button", name="Cancel…").click()
        expect(page.locator("h1")).to_have_text(f"Cancel {waiting} jobs?")
        page.get_by_label("reason to cancel them").fill("newsletter withdrawn")
        page.get_by_role("button", name=f"Yes, cancel {waiting} jobs").click()
        expect(page.locator(".notice")).to_have_text(f"Cancelled {waiting} job(s).")
        assert queue.count_jobs(job_type="mail.send", status="queued") == 0
        for job_id in ids["queued"]:
            assert [(a.action, a.by, a.reason) for a in queue.job_actions(job_id)] == [
                ("cancel", "grace", "newsletter withdrawn")
            ]
        page.goto("about:blank")


def test_the_overview_and_lists_refresh_in_place_until_paused(backend: Backend, page: Any) -> None:
    from playwright.sync_api import expect

    queue, _ = outside_the_browser_loop(populated, backend)
    with serving(create_app(queue, refresh_seconds=5)) as base:
        page.clock.install()
        page.goto(base + "/")
        queued = page.locator('[data-count="queued"]')
        expect(queued).to_have_text("2")
        toggle = page.locator("#refresh-toggle")
        expect(toggle).to_have_text("Pause refresh")

        page.evaluate("window.sqlqueueMarker = 'this page'")  # gone if the page reloads
        enqueue(queue, "mail.send", 3)
        page.clock.run_for(5_500)
        expect(queued).to_have_text("5")  # swapped in place: no navigation
        assert page.evaluate("window.sqlqueueMarker") == "this page"

        toggle.click()
        expect(toggle).to_have_text("Resume refresh")
        expect(toggle).to_have_attribute("aria-pressed", "true")
        asked: list[str] = []
        page.on("request", lambda request: asked.append(request.url))
        enqueue(queue, "mail.send", 4)
        page.clock.run_for(30_000)
        assert asked == []  # six intervals paused: not one request
        assert queued.inner_text() == "5"

        page.goto(base + "/jobs?type=mail.send")  # paused stays paused, page to page
        expect(page.locator("#refresh-toggle")).to_have_text("Resume refresh")
        page.locator("#refresh-toggle").click()
        first = page.locator("#jobs tbody tr").first
        row_id = first.get_attribute("data-job-id")
        first.locator("input[type=checkbox]").check()
        enqueue(queue, "mail.send", 1)
        page.clock.run_for(11_000)
        expect(page.locator(f'#jobs tr[data-job-id="{row_id}"] input')).to_be_checked()
        assert page.locator("#jobs tbody tr").first.get_attribute("data-job-id") == row_id
        first.locator("input[type=checkbox]").uncheck()
        page.locator("h1").click()  # nothing in the list has the focus any more
        page.clock.run_for(5_500)
        expect(page.locator("#jobs tbody tr").first).not_to_have_attribute("data-job-id", row_id)
        page.goto("about:blank")


def test_without_javascript_everything_but_the_refresh_works(
    backend: Backend, chromium: Any
) -> None:
    from playwright.sync_api import expect

    queue, ids = outside_the_browser_loop(populated, backend)
    context = chromium.new_context(java_script_enabled=False)
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    with serving(create_app(queue, current_user=lambda request: "lin")) as base:
        tab.goto(base + "/")
        expect(tab.locator("#refresh-toggle")).to_be_hidden()  # nothing to pause
        tab.goto(f"{base}/jobs?type=flaky")
        tab.get_by_label(f"pick job {ids['failed'][0]}").check()
        tab.get_by_role("button", name="Cancel…").click()
        expect(tab.locator("h1")).to_have_text("Cancel 1 job?")
        tab.get_by_label("reason to cancel them").fill("no script needed")
        tab.get_by_role("button", name="Yes, cancel 1 job").click()
        expect(tab.locator(".notice")).to_have_text("Cancelled 1 job(s).")
        tab.goto(f"{base}/jobs/{ids['queued'][0]}")
        tab.get_by_label("new run time").fill("+1d")
        tab.get_by_label("reason to reschedule").fill("tomorrow")
        tab.get_by_role("button", name="Reschedule").click()
        expect(tab.locator("#history")).to_contain_text("tomorrow")
    context.close()
    failed = queue.get_job(ids["failed"][0])
    assert failed is not None
    assert failed.status is sqlqueue.JobStatus.CANCELLED
    assert [a.action for a in queue.job_actions(ids["queued"][0])] == ["reschedule"]
