"""``Queue.activity``: jobs succeeded, failed and dead per minute over the last hour, on every
backend — the web page's chart reads nothing else."""

from __future__ import annotations

from datetime import timedelta

import pytest

import sqlqueue
from sqlqueue.testing import age_jobs
from tests._support import drain, enqueue
from tests.conftest import Backend
from tests.test_operations import make_queue


def test_activity_of_an_empty_database_is_sixty_minutes_of_zeros(backend: Backend) -> None:
    activity = backend.queue().activity()

    assert len(activity.minutes) == 60
    assert all((m.succeeded, m.failed, m.dead) == (0, 0, 0) for m in activity.minutes)
    starts = [minute.start for minute in activity.minutes]
    assert starts == sorted(starts)
    assert activity.minutes[-1].start == activity.taken_at - timedelta(minutes=1)
    assert activity.to_dict()["minutes"][0]["succeeded"] == 0


def test_activity_counts_each_job_in_the_minute_it_finished_or_failed(backend: Backend) -> None:
    queue = make_queue(backend)
    done = enqueue(queue, "ok", 3)
    dead = enqueue(queue, "boom", 2)
    failing = enqueue(queue, "flaky", 1)
    drain(queue)
    # Move one success 10.5 minutes back, one death 30.5 minutes back, and one success out of
    # the hour: the others stay in the latest minute (the half minutes are the margin for the
    # time between the drain and the activity query).
    age_jobs(queue, done[:1], by=timedelta(minutes=10, seconds=30))
    age_jobs(queue, dead[:1], by=timedelta(minutes=30, seconds=30))
    age_jobs(queue, done[1:2], by=timedelta(minutes=90))

    activity = queue.activity()

    latest = activity.minutes[-1]
    assert (latest.succeeded, latest.failed, latest.dead) == (1, len(failing), 1)
    assert activity.minutes[-11].succeeded == 1
    assert activity.minutes[-31].dead == 1
    assert sum(m.succeeded for m in activity.minutes) == 2
    assert sum(m.dead for m in activity.minutes) == 2
    assert sum(m.failed for m in activity.minutes) == 1


def test_activity_over_fewer_minutes_leaves_older_jobs_out(backend: Backend) -> None:
    queue = make_queue(backend)
    done = enqueue(queue, "ok", 2)
    drain(queue)
    age_jobs(queue, done[:1], by=timedelta(minutes=20))

    activity = queue.activity(minutes=5)

    assert len(activity.minutes) == 5
    assert sum(m.succeeded for m in activity.minutes) == 1


@pytest.mark.parametrize("minutes", [0, -1, 1441])
def test_activity_refuses_a_window_out_of_range(minutes: int, tmp_path) -> None:
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'unopened.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match="minutes must be between 1 and 1440"):
        queue.activity(minutes=minutes)
