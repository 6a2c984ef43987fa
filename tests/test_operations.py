"""The operators' API on both backends: stats, health, search, dead-letter actions, prune, pause.

Each test builds its jobs through the public API (enqueue, a burst worker) and reads them back
the way an operator would; jobs that finished or failed long ago are made so with
``sqlqueue.testing.age_jobs``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue._worker.pauses import Pauses
from sqlqueue.dialects import dialect_for
from sqlqueue.testing import age_jobs
from tests._support import bounded, db_now, drain, enqueue, wait_until
from tests.conftest import Backend

STATUSES = ["queued", "running", "succeeded", "failed", "dead", "cancelled", "waiting"]


def make_queue(backend: Backend, **options: object) -> sqlqueue.Queue:
    """A queue with tasks that succeed, fail once and die, on two queues."""
    queue = backend.queue(**options)

    @queue.task("ok", queue="mail")
    def ok(n: int = 0) -> None:
        return None

    @queue.task("boom", queue="hooks", max_attempts=1)
    def boom(n: int = 0, error: str = "boom") -> None:
        raise ConnectionError(error)

    @queue.task("flaky", queue="hooks", max_attempts=3, backoff=[3600])
    def flaky(n: int = 0) -> None:
        raise TimeoutError("endpoint timed out")

    return queue


# -- stats and health ---------------------------------------------------------------------------


def test_stats_of_an_empty_database_has_every_status_at_zero(backend: Backend) -> None:
    stats = backend.queue().stats()

    assert stats.by_status == dict.fromkeys(STATUSES, 0)
    assert stats.queues == {}
    assert stats.job_types == {}
    assert (stats.failed_last_hour, stats.dead_last_hour, stats.top_errors) == (0, 0, ())
    assert stats.to_dict()["by_status"] == dict.fromkeys(STATUSES, 0)


def test_stats_counts_by_status_queue_and_type_with_ages_and_top_errors(backend: Backend) -> None:
    queue = make_queue(backend)
    enqueue(queue, "ok", 3)
    enqueue(queue, "boom", 2, error="503 from crm")
    enqueue(queue, "boom", 1, error="410 Gone")
    enqueue(queue, "flaky", 1)
    drain(queue)
    waiting = enqueue(queue, "ok", 2)  # due now, nobody serves them yet
    age_jobs(queue, waiting[:1], by=timedelta(hours=2))

    stats = queue.stats()

    assert stats.by_status == {
        "queued": 2, "running": 0, "succeeded": 3, "failed": 1,
        "dead": 3, "cancelled": 0, "waiting": 0,
    }  # fmt: skip
    assert stats.queues["mail"].by_status["succeeded"] == 3
    assert stats.queues["mail"].by_status["queued"] == 2
    assert stats.queues["hooks"].by_status == {
        "queued": 0, "running": 0, "succeeded": 0, "failed": 1,
        "dead": 3, "cancelled": 0, "waiting": 0,
    }  # fmt: skip
    assert stats.job_types["boom"]["dead"] == 3
    assert stats.job_types["flaky"]["failed"] == 1
    # The oldest due job of "mail" has waited two hours by the database clock; the failed
    # flaky job is not due for an hour, so "hooks" has nothing waiting.
    mail_age = stats.queues["mail"].oldest_queued_age_seconds
    assert mail_age is not None
    assert 7190 < mail_age < 7300
    assert stats.queues["hooks"].oldest_queued_age_seconds is None
    assert (stats.failed_last_hour, stats.dead_last_hour) == (1, 3)
    assert [(e.error, e.count) for e in stats.top_errors] == [
        ("ConnectionError: 503 from crm", 2),
        ("ConnectionError: 410 Gone", 1),
        ("TimeoutError: endpoint timed out", 1),
    ]
    as_dict = stats.to_dict()
    assert set(as_dict) >= {
        "by_status", "queues", "job_types", "failed_last_hour", "dead_last_hour", "top_errors",
    }  # fmt: skip
    assert as_dict["queues"]["mail"]["paused"] is False
    assert as_dict["top_errors"][0] == {"error": "ConnectionError: 503 from crm", "count": 2}


def test_deaths_older_than_an_hour_and_handled_ones_do_not_count_as_recent(
    backend: Backend,
) -> None:
    queue = make_queue(backend)
    dead = enqueue(queue, "boom", 4)
    drain(queue)
    age_jobs(queue, dead[:1], by=timedelta(hours=2))
    queue.discard(dead[1], by="ops", reason="customer deleted")
    queue.requeue(dead[2], by="ops", reason="fixed")

    stats = queue.stats()

    assert stats.dead_last_hour == 1  # dead[3] only
    assert stats.by_status["dead"] == 4  # the rows are all still dead
    # Top errors count what still needs a person: dead[0] and dead[3].
    assert [(e.error, e.count) for e in stats.top_errors] == [("ConnectionError: boom", 2)]


def test_health_raises_each_alarm_over_its_threshold_and_none_under(backend: Backend) -> None:
    queue = make_queue(backend)
    enqueue(queue, "boom", 3, error="same")
    drain(queue)
    stuck = enqueue(queue, "ok", 1)
    age_jobs(queue, stuck, by=timedelta(minutes=10))

    healthy = queue.health(
        max_queued_age=3600, max_dead_last_hour=3, max_same_error=3, max_unserved=3600
    )
    assert healthy.ok
    assert healthy.alarms == ()

    sick = queue.health(max_queued_age=300, max_dead_last_hour=2, max_same_error=2)
    assert not sick.ok
    by_name = {alarm.name: alarm for alarm in sick.alarms}
    assert set(by_name) == {"dead_jobs", "same_error", "queued_age", "no_workers"}
    assert (by_name["dead_jobs"].figure, by_name["dead_jobs"].threshold) == (3, 2)
    assert by_name["same_error"].error == "ConnectionError: same"
    assert by_name["queued_age"].queue == "mail"
    assert by_name["queued_age"].figure > 590
    assert "is any worker serving it" in by_name["queued_age"].message
    assert sick.to_dict()["ok"] is False

    # Discarding the dead jobs silences both dead-job alarms; pausing the queue, its age alarm.
    queue.discard_where(by="ops", reason="known outage", error_contains="same")
    queue.pause("mail", by="ops", reason="maintenance")
    assert queue.health(max_queued_age=300, max_dead_last_hour=2, max_same_error=2).ok


def test_health_refuses_negative_thresholds(backend: Backend) -> None:
    with pytest.raises(sqlqueue.ConfigurationError, match="thresholds"):
        backend.queue().health(max_queued_age=-1)


# -- search -----------------------------------------------------------------------------------


def test_jobs_filters_and_pages_newest_first(backend: Backend) -> None:
    queue = make_queue(backend)
    enqueue(queue, "ok", 5)
    dead = enqueue(queue, "boom", 3, error="503 from crm.example.com")
    enqueue(queue, "boom", 2, error="410 Gone")
    drain(queue)

    newest = queue.jobs(limit=4)
    assert [job.id for job in newest] == sorted((job.id for job in newest), reverse=True)
    assert len(newest) == 4
    rest = queue.jobs(limit=100, before_id=newest[-1].id)
    assert len(newest) + len(rest) == 10
    assert max(job.id for job in rest) < newest[-1].id

    crm = queue.jobs(status="dead", error_contains="crm.example")
    assert sorted(job.id for job in crm) == dead
    assert queue.jobs(job_type="ok", queue="mail", status="succeeded", limit=2)[0].job_type == "ok"
    assert queue.jobs(queue="nowhere") == []
    # LIKE's wildcards are searched for as plain text.
    assert queue.jobs(error_contains="%") == []


def test_jobs_since_and_until_bound_the_latest_change(backend: Backend) -> None:
    queue = make_queue(backend)
    old, new = enqueue(queue, "ok", 2)
    now = db_now(backend.engine)
    age_jobs(queue, [old], by=timedelta(days=2))

    assert [job.id for job in queue.jobs(since=now - timedelta(hours=1))] == [new]
    assert [job.id for job in queue.jobs(until=now - timedelta(days=1))] == [old]


def test_jobs_rejects_bad_filters_before_touching_the_database(backend: Backend) -> None:
    queue = backend.queue()
    with pytest.raises(sqlqueue.ConfigurationError, match="status must be one of"):
        queue.jobs(status="done")
    with pytest.raises(sqlqueue.ConfigurationError, match="limit"):
        queue.jobs(limit=0)
    with pytest.raises(sqlqueue.ConfigurationError, match="timezone-aware"):
        queue.jobs(since=datetime(2026, 1, 1))


# -- dead letters ------------------------------------------------------------------------------


def test_requeue_where_requeues_matching_dead_jobs_once(backend: Backend) -> None:
    queue = make_queue(backend)
    crm = enqueue(queue, "boom", 7, error="503 from crm")
    other = enqueue(queue, "boom", 2, error="400 Bad Request")
    drain(queue)

    new_ids = bounded(  # a bulk requeue that found requeued rows again would never end
        "requeue_where in batches of 3",
        lambda: queue.requeue_where(
            by="alice", reason="CRM is back", error_contains="crm", batch_size=3
        ),
    )

    assert len(new_ids) == 7
    for dead_id, new_id in zip(crm, new_ids, strict=True):  # oldest first, one new job each
        dead = queue.get_job(dead_id)
        fresh = queue.get_job(new_id)
        assert dead is not None
        assert fresh is not None
        assert (dead.status, dead.requeued_as, dead.requeued_by) == ("dead", new_id, "alice")
        assert dead.requeue_reason == "CRM is back"
        assert (fresh.status, fresh.requeued_from, fresh.payload) == (
            "queued",
            dead_id,
            dead.payload,
        )
    # Again: nothing left to requeue; the other errors were never touched.
    again = bounded(
        "requeue_where again",
        lambda: queue.requeue_where(by="alice", reason="again", error_contains="crm"),
    )
    assert again == []
    assert all(queue.get_job(job_id).requeued_as is None for job_id in other)  # type: ignore[union-attr]
    # One by one after a filter: refused, saying where the job went.
    with pytest.raises(sqlqueue.JobStateError, match="already requeued as job"):
        queue.requeue(crm[0], by="bob", reason="twice")


def test_requeue_where_honours_limit_ids_and_type(backend: Backend) -> None:
    queue = make_queue(backend)
    dead = enqueue(queue, "boom", 5)
    drain(queue)

    assert len(queue.requeue_where(by="a", reason="r", job_ids=dead[:3], limit=2)) == 2
    assert len(queue.requeue_where(by="a", reason="r", job_type="nothing-like-it")) == 0
    assert len(queue.requeue_where(by="a", reason="r", job_type="boom")) == 3


def test_discard_marks_dead_jobs_handled_and_keeps_them_dead(backend: Backend) -> None:
    queue = make_queue(backend)
    dead = enqueue(queue, "boom", 3)
    ok = enqueue(queue, "ok", 1)
    drain(queue)

    job = queue.discard(dead[0], by="carol", reason="duplicate order")
    assert (job.status, job.discarded_by, job.discard_reason) == (
        "dead",
        "carol",
        "duplicate order",
    )
    assert job.discarded_at is not None
    with pytest.raises(sqlqueue.JobStateError, match="already discarded by carol"):
        queue.discard(dead[0], by="dave", reason="again")
    with pytest.raises(sqlqueue.JobStateError, match="only dead jobs"):
        queue.discard(ok[0], by="dave", reason="not dead")
    with pytest.raises(sqlqueue.JobNotFound):
        queue.discard(10**9, by="dave", reason="missing")

    assert queue.discard_where(by="carol", reason="all of them", job_type="boom") == dead[1:]
    assert queue.stats().by_status["dead"] == 3
    assert queue.requeue_where(by="carol", reason="x", job_type="boom") == []  # handled already
    assert [j.id for j in queue.jobs(status="dead", unhandled=True)] == []


def test_dead_letter_actions_need_who_and_why(backend: Backend) -> None:
    queue = backend.queue()
    for action in (queue.requeue_where, queue.discard_where):
        with pytest.raises(sqlqueue.ConfigurationError, match=r"by= \(who\) and reason="):
            action(by="", reason="x")
    with pytest.raises(sqlqueue.ConfigurationError, match=r"by= \(who\) and reason="):
        queue.discard(1, by="x", reason="")


# -- retention --------------------------------------------------------------------------------


def test_prune_deletes_only_old_finished_jobs(backend: Backend) -> None:
    queue = make_queue(backend)
    done = enqueue(queue, "ok", 5)
    dead = enqueue(queue, "boom", 2)
    failed = enqueue(queue, "flaky", 1)
    drain(queue)
    queued = enqueue(queue, "ok", 1)
    age_jobs(queue, done[1:] + dead + failed + queued, by=timedelta(days=30))  # done[0]: recent

    assert queue.prune(older_than=86400, batch_size=2) == 4
    assert queue.prune(older_than=86400) == 0
    remaining = {job.id for job in queue.jobs(limit=100)}
    assert remaining == {done[0], *dead, *failed, *queued}
    assert queue.prune(older_than=86400, statuses=["dead"]) == 2
    # Never queued, running or failed jobs, whatever their times say.
    with pytest.raises(sqlqueue.ConfigurationError, match="only finished jobs"):
        queue.prune(older_than=0, statuses=["failed"])
    with pytest.raises(sqlqueue.ConfigurationError, match="older_than"):
        queue.prune(older_than=-1)


def test_prune_of_dead_jobs_keeps_those_that_died_recently(backend: Backend) -> None:
    queue = make_queue(backend)
    old, recent = enqueue(queue, "boom", 2)
    drain(queue)
    age_jobs(queue, [old], by=timedelta(days=30))

    assert queue.prune(older_than=86400, statuses=["dead"]) == 1
    assert queue.get_job(old) is None
    kept = queue.get_job(recent)
    assert kept is not None
    assert kept.status == "dead"  # died a moment ago: a person may still want to look at it
    assert queue.prune(older_than=86400, statuses=["dead"]) == 0
    assert queue.get_job(recent) is not None


def test_retention_is_checked_when_the_queue_is_built(backend: Backend) -> None:
    with pytest.raises(sqlqueue.ConfigurationError, match=r"Retention\.succeeded"):
        sqlqueue.Retention(succeeded=-5)
    with pytest.raises(sqlqueue.ConfigurationError, match="retention"):
        backend.queue(retention={"succeeded": 60})


def test_a_worker_with_retention_prunes_as_a_duty(backend: Backend) -> None:
    queue = make_queue(
        backend, retention=sqlqueue.Retention(succeeded=3600, interval=0.05, batch_size=2)
    )
    done = enqueue(queue, "ok", 5)
    drain(queue)
    age_jobs(queue, done[:3], by=timedelta(days=1))

    worker = queue.worker(poll_interval=0.02)
    from tests._support import WorkerThread, wait_until

    with WorkerThread(worker):
        wait_until(lambda: len(queue.jobs(status="succeeded")) == 2, timeout=10)
    assert {job.id for job in queue.jobs()} == set(done[3:])


# -- retry now --------------------------------------------------------------------------------


def test_retry_now_makes_waiting_failed_jobs_due_keeping_their_attempts(backend: Backend) -> None:
    queue = backend.queue()
    attempts: list[tuple[str, int]] = []

    @queue.task("flaky", queue="hooks", max_attempts=3, backoff=[3600.0])
    def flaky(name: str, ctx: sqlqueue.JobContext) -> None:
        attempts.append((name, ctx.attempt))
        raise ConnectionError("partner down")

    @queue.task("other", queue="mail", max_attempts=3, backoff=[3600.0])
    def other(name: str) -> None:
        raise ConnectionError("smtp down")

    with backend.engine.begin() as conn:
        a = queue.enqueue(conn, "flaky", {"name": "a"})
        b = queue.enqueue(conn, "flaky", {"name": "b"})
        mail = queue.enqueue(conn, "other", {"name": "m"})
        queued = queue.enqueue(conn, "flaky", {"name": "q"}, delay=3600)
    drain(queue)
    assert [job.status for job in map(queue.get_job, (a, b, mail))] == ["failed"] * 3  # type: ignore[union-attr]

    assert queue.retry_now(job_ids=[a]) == 1
    job = queue.get_job(a)
    assert job is not None
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.next_run_at <= db_now(backend.engine)
    assert queue.retry_now(job_ids=[a]) == 0, "already due: nothing to bring forward"
    assert queue.retry_now(queue="hooks") == 1  # b; not the queued job, not the mail job
    assert queue.retry_now(job_type="nothing") == 0

    attempts.clear()
    drain(queue)
    assert sorted(attempts) == [("a", 2), ("b", 2)]
    assert queue.get_job(queued).status == "queued"  # type: ignore[union-attr]
    assert queue.get_job(mail).attempts == 1  # type: ignore[union-attr]
    assert queue.retry_now() == 3, "no filter: every failed job"


def test_run_now_makes_the_given_waiting_jobs_due_whatever_they_wait_for(backend: Backend) -> None:
    queue = backend.queue()

    @queue.task("later")
    def later(n: int) -> None:
        if n == 1:
            raise sqlqueue.Snooze(3600)
        if n == 2:
            raise ConnectionError("down")

    with backend.engine.begin() as conn:
        snoozed, failed, done = (queue.enqueue(conn, "later", {"n": n}) for n in (1, 2, 3))
        delayed = queue.enqueue(conn, "later", {"n": 4}, delay=3600)
        untouched = queue.enqueue(conn, "later", {"n": 5}, delay=3600)
    drain(queue)
    statuses = [queue.get_job(i).status for i in (snoozed, failed, done)]  # type: ignore[union-attr]
    assert statuses == ["queued", "failed", "succeeded"]

    assert queue.run_now([snoozed, failed, done, delayed]) == 3  # not the finished one
    now = db_now(backend.engine)
    for job_id in (snoozed, failed, delayed):
        job = queue.get_job(job_id)
        assert job is not None
        assert job.next_run_at <= now
    assert queue.get_job(untouched).next_run_at > now  # type: ignore[union-attr]
    assert queue.get_job(snoozed).attempts == 0  # type: ignore[union-attr]
    assert queue.get_job(failed).attempts == 1  # type: ignore[union-attr]
    assert queue.run_now([snoozed]) == 0, "already due"
    assert queue.run_now([]) == 0


# -- pausing ----------------------------------------------------------------------------------


def test_pause_and_resume_are_visible_in_stats(backend: Backend) -> None:
    queue = make_queue(backend)
    queue.pause("reports", by="ops", reason="migrating the warehouse")
    queue.pause("reports", by="ops", reason="still migrating")  # again: still paused

    assert queue.paused_queues() == ["reports"]
    reports = queue.stats().queues["reports"]
    assert reports.paused is True  # paused, even with no jobs
    assert (reports.paused_by, reports.pause_reason) == ("ops", "still migrating")
    assert reports.paused_at is not None
    assert abs((db_now(backend.engine) - reports.paused_at).total_seconds()) < 60
    assert reports.to_dict()["pause_reason"] == "still migrating"
    assert queue.resume("reports") is True
    running = queue.stats().queues.get("reports")
    assert running is None or (running.paused, running.paused_by) == (False, None)
    assert queue.resume("reports") is False
    assert queue.paused_queues() == []
    with pytest.raises(sqlqueue.ConfigurationError, match=r"by= \(who\)"):
        queue.pause("reports", by="", reason="x")


def test_a_paused_queues_jobs_wait_and_others_run(backend: Backend) -> None:
    queue = make_queue(backend)
    queue.pause("hooks", by="ops", reason="partner outage")
    hooks = enqueue(queue, "boom", 2)  # enqueueing into a paused queue still works
    mail = enqueue(queue, "ok", 2)

    drain(queue, queues=["mail", "hooks"])

    assert {queue.get_job(i).status for i in mail} == {"succeeded"}  # type: ignore[union-attr]
    assert {queue.get_job(i).status for i in hooks} == {"queued"}  # type: ignore[union-attr]
    queue.resume("hooks")
    drain(queue, queues=["mail", "hooks"])
    assert {queue.get_job(i).status for i in hooks} == {"dead"}  # type: ignore[union-attr]


def test_a_worker_leaves_a_paused_queue_out_of_its_claims_before_it_says_it_paused(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker's database calls run one at a time on its database thread. The read of the
    # pauses applies them there, so every claim round after it leaves the queue out and every
    # round before it has finished; the log line comes later, on the loop. (Applied on the loop
    # after the log, a round computed before could wait for SQLite's write lock past an enqueue
    # made after the log line, and lease those jobs: a flake of
    # test_operations_processes.py's pause test, seed 1616317573.)
    queue = make_queue(backend)
    pauses = Pauses(queue.admin, served=["mail", "reports"])
    queue.pause("reports", by="ops", reason="warehouse migration")

    change = pauses.read()
    assert pauses.active(("mail", "reports")) == ("mail",)
    assert "paused by an operator" not in caplog.text
    assert pauses.update(change) == frozenset()
    assert "paused by an operator, no new claims: ['reports']" in caplog.text

    queue.resume("reports")
    change = pauses.read()
    assert pauses.active(("mail", "reports")) == ("mail", "reports")
    assert pauses.update(change) == {"reports"}


# -- counting the finished history -----------------------------------------------------------


def exact_counts(engine: sa.Engine) -> dict[tuple[str, str, str], int]:
    """Counts by (status, queue, job_type) straight from the job rows."""
    query = sa.select(jobs.c.status, jobs.c.queue, jobs.c.job_type, sa.func.count()).group_by(
        jobs.c.status, jobs.c.queue, jobs.c.job_type
    )
    with engine.connect() as conn:
        return {(s, q, t): int(n) for s, q, t, n in conn.execute(query)}


def stats_counts(queue: sqlqueue.Queue) -> dict[tuple[str, ...], int]:
    """The same counts as stats() reports them (per status and queue, per status and type)."""
    stats = queue.stats()
    per_queue: dict[tuple[str, ...], int] = {
        (s, q): n for q, qs in stats.queues.items() for s, n in qs.by_status.items() if n
    }
    per_type: dict[tuple[str, ...], int] = {
        ("type", s, t): n for t, ts in stats.job_types.items() for s, n in ts.items() if n
    }
    return per_queue | per_type


def expected(engine: sa.Engine) -> dict[tuple[str, ...], int]:
    by_queue: dict[tuple[str, ...], int] = {}
    by_type: dict[tuple[str, ...], int] = {}
    for (status, queue_name, job_type), n in exact_counts(engine).items():
        by_queue[(status, queue_name)] = by_queue.get((status, queue_name), 0) + n
        by_type[("type", status, job_type)] = by_type.get(("type", status, job_type), 0) + n
    return by_queue | by_type


def test_stats_stay_exact_across_folds_prunes_requeues_and_discards(backend: Backend) -> None:
    queue = make_queue(backend)
    ok = enqueue(queue, "ok", 12)
    dead = enqueue(queue, "boom", 6)
    drain(queue)
    age_jobs(queue, ok[:8] + dead[:2], by=timedelta(days=3))
    assert stats_counts(queue) == expected(backend.engine)  # nothing folded yet: all live

    # Everything finished before now is folded. On MariaDB a fold whose copy of innodb_trx
    # stayed stale (other sessions of the server reading it, as the other test workers do)
    # stops at a cautious bound and folds the rest on a later call: never a job twice.
    folded = [0]

    def all_folded() -> bool:
        folded[0] += queue.admin.fold_all_counts(margin=0)
        assert folded[0] <= 18
        assert stats_counts(queue) == expected(backend.engine)
        return folded[0] == 18

    # Between tries, a pause longer than InnoDB's 0.1 s: polled faster, the copy never renews.
    wait_until(all_folded, timeout=60, interval=0.25, what="every finished job to be folded")
    assert queue.admin.fold_all_counts(margin=0) == 0  # nothing new since
    assert stats_counts(queue) == expected(backend.engine)

    more = enqueue(queue, "ok", 5)  # finished after the fold: counted live
    drain(queue)
    queue.requeue_where(by="ops", reason="r", job_ids=dead[2:4])  # dead rows stay dead
    queue.discard(dead[4], by="ops", reason="d")
    assert stats_counts(queue) == expected(backend.engine)

    # Prune deletes folded rows (subtracted from the rollup) and, with older_than=0, unfolded
    # ones too (never counted there).
    assert queue.prune(older_than=86400, batch_size=3) == 8
    assert stats_counts(queue) == expected(backend.engine)
    queue.admin.fold_all_counts(margin=0)
    assert stats_counts(queue) == expected(backend.engine)
    assert queue.prune(older_than=0, statuses=["succeeded", "dead"]) == 4 + len(more) + 6
    assert stats_counts(queue) == expected(backend.engine)
    assert queue.stats().by_status["succeeded"] == 0


def test_stats_read_one_snapshot_when_jobs_finish_during_the_read(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlqueue._store import counts, readmodel

    queue = make_queue(backend)
    ids = enqueue(queue, "ok", 3)
    counted = counts.read_finished_counts

    def a_job_is_cancelled_meanwhile(conn: sa.Connection, dialect: object) -> object:
        queue.cancel(ids[0])  # another connection commits between stats' statements
        return counted(conn, dialect)  # type: ignore[arg-type]

    monkeypatch.setattr(readmodel, "read_finished_counts", a_job_is_cancelled_meanwhile)
    stats = queue.stats()

    assert sum(stats.by_status.values()) == 3  # the job counted once, queued or cancelled
    assert stats.by_status["queued"] == 3  # as it was when the read began


def test_a_fold_never_passes_a_writing_transaction_still_open(backend: Backend) -> None:
    if dialect_for(backend.engine).single_writer:
        pytest.skip("a single-writer database commits every write before the fold can start")
    queue = make_queue(backend)
    ids = enqueue(queue, "ok", 5)
    with backend.engine.connect() as writer, writer.begin():
        assert queue.cancel_where(job_type="nothing") == 0
        # cancel in a transaction that stays open across the fold (a slow cancel_where)
        writer.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(ids))
            .values(status="cancelled", finished_at=dialect_for(backend.engine).clock())
        )
        # The fold's "now" (database clock) must be past these finishing times.
        written = writer.execute(sa.select(sa.func.max(jobs.c.finished_at))).scalar_one()
        wait_until(lambda: db_now(backend.engine) > written)
        queue.admin.fold_all_counts(margin=0)
    # committed now, with finishing times older than the fold's "now"
    assert queue.stats().by_status["cancelled"] == 5
    queue.admin.fold_all_counts(margin=0)
    assert queue.stats().by_status["cancelled"] == 5
    assert queue.prune(older_than=0, statuses=["cancelled"]) == 5
    assert queue.stats().by_status["cancelled"] == 0


def test_a_long_history_is_folded_in_day_windows(backend: Backend) -> None:
    queue = make_queue(backend)
    done = enqueue(queue, "ok", 6)
    drain(queue)
    for age_days, job_id in zip((30, 20, 10, 5, 3, 2), done, strict=True):
        age_jobs(queue, [job_id], by=timedelta(days=age_days))

    folds = []
    while not (fold := queue.admin.fold_counts(margin=0)).caught_up:
        folds.append(fold.folded)
    folds.append(fold.folded)

    assert sum(folds) == 6
    assert len(folds) == 7  # a window per job (empty spans skipped), then one to catch up
    assert queue.stats().by_status["succeeded"] == 6


def test_a_fold_never_waits_for_a_stalled_holder_of_the_counts(backend: Backend) -> None:
    """A worker SIGSTOPped in the middle of a fold holds the mark's lock; the other workers'
    folds (on their database threads, between claims) must skip, not wait behind it."""
    backend.requires("row_locks")
    queue = make_queue(backend)
    queue.admin.fold_all_counts(margin=0)  # the mark exists
    with backend.engine.connect() as stalled, stalled.begin():
        from sqlqueue._schema import count_marks

        stalled.execute(sa.select(count_marks).with_for_update()).all()
        # A fold or prune that waited would wait for the stalled one's transaction: forever.
        fold = bounded("a fold beside a stalled one", lambda: queue.admin.fold_counts(margin=0))
        assert fold.folded == 0
        with pytest.raises(sqlqueue.DatabaseError, match="holds the finished-job counts"):
            bounded(
                "a prune beside a stalled fold",
                lambda: queue.admin.prune_batch(status="succeeded", older_than=0, limit=10),
            )


def test_a_fold_never_waits_for_a_first_fold_stalled_before_the_mark_exists(
    backend: Backend,
) -> None:
    """The first fold of a database's life used to create the mark inside its own transaction:
    a worker stalled there held an uncommitted mark row that every other worker's fold (on its
    database thread, which also claims and reaps) waited for. The mark is now created in a
    transaction of its own, so a stalled fold never holds it unwritten."""
    backend.requires("row_locks")
    from sqlqueue._store import counts

    queue = make_queue(backend)
    queue.admin.reset_counts()  # the database's first fold is still to come
    dialect = queue.admin.dialect
    with backend.engine.connect() as stalled, stalled.begin():
        # What a worker's fold transaction does before it stalls: it finds no mark and writes
        # nothing (its worker creates the mark in a transaction of its own, then folds again).
        with pytest.raises(counts.MarkMissing):
            counts.fold_counts(stalled, dialect, margin=0)
        fold = bounded("a fold beside a stalled first fold", lambda: queue.admin.fold_counts())
        assert fold.folded == 0
        pruned = bounded(
            "a prune beside a stalled first fold",
            lambda: queue.admin.prune_batch(status="succeeded", older_than=0, limit=10),
        )
        assert pruned == 0
    assert queue.admin.fold_counts(margin=0).caught_up


def test_database_now_is_the_database_clock_timezone_aware(backend: Backend) -> None:
    queue = backend.queue()

    now = queue.database_now()

    assert now.tzinfo is not None
    assert abs((now - db_now(backend.engine)).total_seconds()) < 60
