"""``python -m bench.mail``: email messages per second through one worker to a local SMTP server.

A backlog of templated messages is enqueued with ``Mailer.send`` (one transaction), then one
``python -m sqlqueue worker bench.mail_app:queue --burst`` process sends them all to an
aiosmtpd sink in this process (127.0.0.1, a free port; it accepts and counts). Each message is
one SMTP exchange — a new connection per message (connect, EHLO, MAIL, RCPT, DATA, QUIT), or
with ``--connections reused`` a kept one (NOOP, MAIL, RCPT, DATA) — plus the ledger lookup and
the ledger row written with the job's success. The rate is messages divided by the drain window on
the database clock (first ``started_at`` to last ``finished_at``), so interpreter start-up is not
measured; each figure is the median of ``--runs`` runs, each on a fresh database.

Needs ``pip install -e '.[test]'`` (aiosmtplib and aiosmtpd). Kept apart from ``python -m
bench``, whose default run it does not slow down::

    python -m bench.mail                     # 1,000 messages, concurrency 1 and 10, new and reused
    python -m bench.mail --messages 200 --backends sqlite --concurrency 4 --connections new
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench.databases import BACKENDS, DEFAULT_POSTGRES_URL, ROOT, Target, fresh_database
from sqlqueue.email import SMTP, Content, Mailer

__all__ = ["main", "make_mailer", "measure"]


def make_mailer(url: str, port: int, pool_size: int = 0) -> tuple[sqlqueue.Queue, Mailer]:
    """The benchmark's queue on ``url`` and its Mailer, sending to 127.0.0.1:``port`` over
    ``pool_size`` kept connections (0: one connection per message)."""
    queue = sqlqueue.Queue(url)
    mailer = Mailer(
        queue,
        smtp=SMTP(host="127.0.0.1", port=port, starttls=False, pool_size=pool_size),
        sender="Bench <bench@example.com>",
    )

    @mailer.template("bench", version="1")
    def bench_message(n: int) -> Content:
        """A small message with a text and an HTML part, like a typical notification."""
        return Content(
            subject=f"Message {n}",
            text=f"This is message {n}.\n" * 20,
            html=f"<p>This is message <b>{n}</b>.</p>" * 20,
        )

    return queue, mailer


class _Sink:
    """An aiosmtpd handler that accepts every message and counts it."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self._lock:
            self.count += 1
            return f"250 2.0.0 Ok: queued as B{self.count}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure(
    url: str, *, messages: int, concurrency: int, reuse: bool, timeout: float = 600.0
) -> float:
    """Send ``messages`` through one worker with ``concurrency`` slots, over one connection per
    message or (``reuse``) up to ``concurrency`` kept connections; return messages/s."""
    from aiosmtpd.controller import Controller

    sink = _Sink()
    port = _free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    env = {
        **os.environ,
        "SQLQUEUE_DATABASE_URL": url,
        "SQLQUEUE_BENCH_SMTP_PORT": str(port),
        "SQLQUEUE_BENCH_SMTP_POOL": str(concurrency if reuse else 0),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    queue, mailer = make_mailer(url, port)
    try:
        with queue.engine.begin() as conn:
            for n in range(messages):
                mailer.send(
                    conn,
                    to=f"user{n}@example.com",
                    template="bench",
                    context={"n": n},
                    dedup_key=f"bench:{n}",
                )
        command = [
            sys.executable,
            *("-m", "sqlqueue", "worker", "bench.mail_app:queue", "--burst"),
            *("--concurrency", str(concurrency), "--poll-interval", "0.05"),
        ]
        subprocess.run(command, cwd=ROOT, env=env, check=True, timeout=timeout)
        with queue.engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT count(*), min(started_at), max(finished_at) FROM sqlqueue_jobs "
                    "WHERE status = 'succeeded'"
                )
            ).one()
        queue.engine.dispose()
    finally:
        controller.stop()
    done, first, last = row
    if done != messages or sink.count != messages:
        raise SystemExit(f"sent {sink.count} and finished {done} jobs of {messages}")
    if isinstance(first, str):  # SQLite returns the text of an aggregate over a DateTime
        from datetime import datetime

        first, last = datetime.fromisoformat(first), datetime.fromisoformat(last)
    return float(messages / (last - first).total_seconds())


def main(argv: list[str] | None = None) -> int:
    """Run the measurements and print one line per backend and concurrency."""
    parser = argparse.ArgumentParser(prog="python -m bench.mail", description=__doc__)
    parser.add_argument("--messages", type=int, default=1000, help="messages per run (1,000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (3)")
    parser.add_argument("--concurrency", default="1,10", help="worker slots to try (1,10)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="sqlite,postgresql")
    parser.add_argument(
        "--connections",
        default="new,reused",
        help="new (one per message) and/or reused (SMTP(pool_size=concurrency)): new,reused",
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--sqlite-dir", type=Path)
    args = parser.parse_args(argv)
    target = Target(postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir)
    modes = [name.strip() for name in args.connections.split(",") if name.strip()]
    if not modes or set(modes) - {"new", "reused"}:
        parser.error(f"--connections: expected new and/or reused, got {args.connections!r}")
    print(f"{args.messages} messages, 1 worker process")
    for backend in [name.strip() for name in args.backends.split(",") if name.strip()]:
        for concurrency in [int(part) for part in args.concurrency.split(",")]:
            for mode in modes:
                rates = []
                for _ in range(args.runs):
                    with fresh_database(backend, target) as url:
                        rates.append(
                            measure(
                                url,
                                messages=args.messages,
                                concurrency=concurrency,
                                reuse=mode == "reused",
                            )
                        )
                print(
                    f"{backend:<10} concurrency {concurrency:>3}, {mode:<6} connections: "
                    f"{statistics.median(rates):7.1f} messages/s "
                    f"(min {min(rates):.1f}, max {max(rates):.1f}, {args.runs} runs)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
