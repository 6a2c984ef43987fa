"""The counts' fold on MariaDB while something polls ``information_schema.innodb_trx``.

Marked ``slow`` (``nox -s slow``), never in the default suite: the copy is the server's, not a
database's, so a poll every 20 ms here keeps it stale for every parallel test worker too, and
their folds (rightly cautious then) would fold less than their tests expect.

InnoDB serves that table from a copy it refreshes only once nobody has read it for 0.1 s: a
monitoring tool, other folds or parallel tests that poll it faster keep the copy stale for as
long as they go on. The fold must then neither pass a write still open (the jobs it wrote
were lost from the counts for good) nor stop folding for ever once the polls stop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.dialects import dialect_for
from tests._support import db_now, wait_until
from tests.conftest import migrated_url

pytestmark = pytest.mark.slow


@pytest.fixture
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """This worker's MariaDB database, migrated and empty."""
    engine = sa.create_engine(migrated_url(request, "mysql", tmp_path))
    yield engine
    engine.dispose()


@pytest.fixture
def polled(engine: sa.Engine) -> Iterator[threading.Event]:
    """A session that reads ``innodb_trx`` every 20 ms, which keeps InnoDB's copy of it from
    being refreshed, until the test sets the returned event (or ends)."""
    stop = threading.Event()
    with _polling(engine, stop):
        yield stop


def _queue(engine: sa.Engine) -> sqlqueue.Queue:
    queue = sqlqueue.Queue(engine)

    @queue.task("ok")
    def ok(n: int = 0) -> None:
        return None

    return queue


def test_a_fold_never_passes_an_open_write_while_the_copy_is_kept_stale(
    engine: sa.Engine, polled: threading.Event
) -> None:
    queue = _queue(engine)
    with engine.begin() as conn:
        ids = [queue.enqueue(conn, "ok", {"n": n}) for n in range(5)]
    with engine.connect() as writer, writer.begin():
        # a cancel in a transaction that stays open across the fold, begun after the poll did
        writer.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(ids))
            .values(status="cancelled", finished_at=dialect_for(engine).clock())
        )
        written = writer.execute(sa.select(sa.func.max(jobs.c.finished_at))).scalar_one()
        wait_until(lambda: db_now(engine) > written)
        assert queue.admin.fold_all_counts(margin=0) == 0
    # committed now, with finishing times older than that fold's "now": still counted
    assert queue.stats().by_status["cancelled"] == 5

    # Once nobody polls, the copy is refreshed and the folds count them in.
    polled.set()
    folded: list[int] = []

    def folded_all() -> bool:
        folded.append(queue.admin.fold_all_counts(margin=0))
        return sum(folded) == 5

    wait_until(folded_all, what="a fold once the copy is refreshed", interval=0.25)
    assert queue.stats().by_status["cancelled"] == 5


def test_a_stale_copy_lets_the_fold_count_what_finished_before_its_youngest_transaction(
    engine: sa.Engine, polled: threading.Event
) -> None:
    """Every transaction a stale copy lists began before the copy was taken, and any write it
    misses began after: the fold counts the jobs that finished before the youngest listed
    transaction began (trx_started has whole seconds: two seconds before it, to be sure)."""
    queue = _queue(engine)
    with engine.begin() as conn:
        early = [queue.enqueue(conn, "ok", {"n": n}) for n in range(3)]
        late = [queue.enqueue(conn, "ok", {"n": n}) for n in range(3, 5)]
    for job_id in early:  # finished and committed
        queue.cancel(job_id)
    finished = db_now(engine)
    wait_until(lambda: (db_now(engine) - finished).total_seconds() > 2.5, interval=0.25)

    polled.set()  # let the copy be refreshed while a reader's transaction is open
    with engine.connect() as reader:
        reader.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        reader.exec_driver_sql("SELECT COUNT(*) FROM sqlqueue_jobs").one()
        wait_until(lambda: _copy_shows(engine, reader), what="the reader", interval=0.25)
        again = threading.Event()
        with _polling(engine, again), engine.connect() as writer, writer.begin():
            # the copy stays as it was: it misses this writer, begun after it was taken
            writer.execute(
                sa.update(jobs)
                .where(jobs.c.id.in_(late))
                .values(status="cancelled", finished_at=dialect_for(engine).clock())
            )
            written = writer.execute(sa.select(sa.func.max(jobs.c.finished_at))).scalar_one()
            wait_until(lambda: db_now(engine) > written)
            assert queue.admin.fold_all_counts(margin=0) == 3
        reader.rollback()
    assert queue.stats().by_status["cancelled"] == 5


@contextmanager
def _polling(engine: sa.Engine, stop: threading.Event) -> Iterator[None]:
    """Poll ``innodb_trx`` every 20 ms (after a first read) until the block ends."""
    first = threading.Event()

    def poll() -> None:
        with engine.connect() as conn:
            while not stop.is_set():
                conn.exec_driver_sql("SELECT COUNT(*) FROM information_schema.innodb_trx").one()
                conn.rollback()
                first.set()
                stop.wait(0.02)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    assert first.wait(30)
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def _copy_shows(engine: sa.Engine, session: sa.Connection) -> bool:
    """Whether InnoDB's copy of its transactions lists ``session``'s."""
    me = session.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
    with engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = %s",
                (me,),
            ).scalar_one()
        )
