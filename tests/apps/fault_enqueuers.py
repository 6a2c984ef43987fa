"""A process of enqueuers racing on one idempotency key: ``python -m tests.apps.fault_enqueuers T``.

T threads, each with its own connection. Protocol on stdout (JSON lines) and stdin: ``ready``
once every thread is connected; then for each stdin line ``{"key": K, "plan": [{"mode":
"commit"|"rollback", "hold": seconds}, …]}`` (one entry per thread) every thread enqueues a job
with key K in its own transaction, at once, holds it ``hold`` seconds (announcing
``{"event": "enqueued"}`` when it holds), then commits or rolls back; the process answers one
``{"event": "round", "results": […]}`` line. End of stdin ends the process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import sqlalchemy as sa

import sqlqueue

JOB_TYPE = "fault.idempotent"
_print_lock = threading.Lock()


def _say(**event: Any) -> None:
    with _print_lock:
        print(json.dumps(event), flush=True)


def _contend(
    queue: sqlqueue.Queue, conn: sa.Connection, key: str, mode: str, hold: float
) -> dict[str, Any]:
    result: dict[str, Any] = {"mode": mode, "hold": hold, "began": time.time()}
    try:
        with conn.begin() as tx:
            result["id"] = queue.enqueue(
                conn, JOB_TYPE, {"pid": os.getpid()}, idempotency_key=key, external=True
            )
            result["enqueued"] = time.time()
            if hold:
                _say(event="enqueued", id=result["id"])
                time.sleep(hold)
            result["ending"] = time.time()
            if mode == "commit":
                tx.commit()
            else:
                tx.rollback()
    except Exception as error:  # the test fails on any error reaching the caller
        result["error"] = f"{type(error).__module__}.{type(error).__qualname__}: {error}"
    result["ended"] = time.time()
    return result


def main() -> int:
    """Serve rounds until stdin ends."""
    threads = int(sys.argv[1])
    queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"])
    connections = [queue.engine.connect() for _ in range(threads)]
    for conn in connections:
        conn.exec_driver_sql("SELECT 1")  # connected now: the race is only the enqueue
        conn.rollback()
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        results: list[dict[str, Any]] = [{} for _ in range(threads)]

        def run(
            index: int,
            step: dict[str, Any],
            key: str = order["key"],
            results: list[dict[str, Any]] = results,
        ) -> None:
            results[index] = _contend(
                queue, connections[index], key, step["mode"], float(step.get("hold", 0))
            )

        workers = [
            threading.Thread(target=run, args=(index, step))
            for index, step in enumerate(order["plan"])
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        _say(event="round", results=results)
    for conn in connections:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
