"""Where a one-job enqueue's time goes on SQLite: each form against raw SQL, in one process.

``python -m bench.enqueue_forms loop FORM N`` runs N enqueues of one form after 30 warm-ups,
for counting instructions (``valgrind --tool=callgrind``) or syscalls (``strace -c -f``)
around it: run it at two N and divide the difference, and start-up cancels out. Forms:
``raw`` (``sqlite3`` INSERT … RETURNING id and commit, as the raw ceiling), ``pooled`` (that
INSERT on a connection from sqlqueue's pool), ``begin`` (that INSERT on the driver's cursor
inside ``engine.begin()``), ``conn`` (``queue.enqueue`` in ``engine.begin()``) and ``engine``
(``queue.enqueue(queue.engine, …)``).

``python -m bench.enqueue_forms interleave N`` runs every form in turn, one enqueue each, N
times, on one file, and prints each one's median: the same disk and the same moment for all.
``--pause S`` sleeps S seconds before each enqueue (outside the timing): off the CPU for as
long as an fsync keeps it, so that a file on ``/dev/shm`` shows what the code costs when it
starts cold, as it does after every commit on a real disk.

``--url`` runs on another database instead of a new SQLite file (a migrated, empty one:
``raw``, ``conn`` and ``engine`` only there).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

import sqlqueue
from bench.names import NOOP
from bench.raw_sql import _SQLITE_ROW, _insert, connect

__all__ = ["main"]

_WARM_UP = 30
_FORMS = ("raw", "pooled", "begin", "conn", "engine")


def _database(directory: str | None) -> str:
    path = Path(tempfile.mkdtemp(prefix="sqlqueue-forms-", dir=directory)) / "forms.db"
    url = f"sqlite:///{path}"
    engine = sa.create_engine(url)
    sqlqueue.migrate(engine)
    engine.dispose()
    return url


def _form(name: str, url: str) -> Callable[[int], object]:
    """One enqueue of form ``name`` on the database at ``url``."""
    if name == "raw":
        raw = connect(url)
        return lambda n: raw.enqueue_one(NOOP, {"n": n})
    queue = sqlqueue.Queue(url)
    sql = _insert(_SQLITE_ROW, 1)

    def pooled(n: int) -> None:
        connection = queue.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute(sql, (NOOP, "default", 0, f'{{"n": {n}}}', 8)).fetchone()
            cursor.close()
            connection.commit()
        finally:
            connection.close()

    def begin(n: int) -> None:
        with queue.engine.begin() as conn:
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            cursor.execute(sql, (NOOP, "default", 0, f'{{"n": {n}}}', 8)).fetchone()

    def in_begin(n: int) -> int:
        with queue.engine.begin() as conn:
            return queue.enqueue(conn, NOOP, {"n": n}, external=True)

    def own(n: int) -> int:
        return queue.enqueue(queue.engine, NOOP, {"n": n}, external=True)

    return {"pooled": pooled, "begin": begin, "conn": in_begin, "engine": own}[name]


def _loop(form: str, jobs: int, directory: str | None, url: str | None) -> None:
    one = _form(form, url or _database(directory))
    for n in range(_WARM_UP):
        one(n)
    started, cpu = time.perf_counter(), time.process_time()
    for n in range(jobs):
        one(n)
    if jobs:
        wall = (time.perf_counter() - started) / jobs * 1e6
        used = (time.process_time() - cpu) / jobs * 1e6
        print(f"{form}: {wall:.1f} µs per enqueue, {used:.1f} µs CPU")


def _interleave(jobs: int, directory: str | None, pause: float, url: str | None) -> None:
    names = _FORMS if url is None else ("raw", "conn", "engine")
    url = url or _database(directory)
    forms = {name: _form(name, url) for name in names}
    for n in range(_WARM_UP):
        for one in forms.values():
            one(n)
    took: dict[str, list[int]] = {name: [] for name in forms}
    for n in range(jobs):
        for name, one in forms.items():
            if pause:
                time.sleep(pause)  # a measurement device: off the CPU, as during an fsync
            started = time.perf_counter_ns()
            one(n)
            took[name].append(time.perf_counter_ns() - started)
    raw = statistics.median(took["raw"])
    for name, times in took.items():
        median = statistics.median(times)
        print(f"{name:<7} median {median / 1000:8.1f} µs   raw/this {raw / median:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.enqueue_forms", description=__doc__)
    parser.add_argument("--dir", help="directory for the SQLite file (default: the temp dir)")
    parser.add_argument("--url", help="a migrated, empty database to use instead")
    commands = parser.add_subparsers(dest="command", required=True)
    loop = commands.add_parser("loop", help="N enqueues of one form")
    loop.add_argument("form", choices=_FORMS)
    loop.add_argument("jobs", type=int)
    interleave = commands.add_parser("interleave", help="every form in turn")
    interleave.add_argument("jobs", type=int)
    interleave.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.command == "loop":
        _loop(args.form, args.jobs, args.dir, args.url)
    else:
        _interleave(args.jobs, args.dir, args.pause, args.url)


if __name__ == "__main__":
    main()
