"""One contender in the idempotency race: enqueue a keyed job in a transaction, then commit or
roll back.

``python -m tests.apps.idempotent_enqueue --key K --mode commit|rollback [--hold]`` with
``SQLQUEUE_DATABASE_URL`` set. The protocol on stdout, one line each: ``ready`` once connected;
then, after reading ``go`` on stdin, a JSON ``began`` event (its transaction begins next), a
JSON ``enqueued`` event (the job is written but not yet committed) and a JSON ``done`` event
with the id ``enqueue`` returned and any error. Holding (``--hold``) keeps the transaction open
until ``end`` is read on stdin, so the test decides when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import sqlqueue

JOB_TYPE = "idempotent.job"


def _say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def main() -> int:
    """Run one contender; exit 0 unless enqueue (or the commit) raised."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--key", required=True)
    parser.add_argument("--mode", choices=["commit", "rollback"], required=True)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()

    queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"])
    with queue.engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")  # connect now, so the race is only the enqueue
        conn.rollback()
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        result: dict[str, Any] = {"event": "done", "pid": os.getpid(), "mode": args.mode}
        result["began_at"] = time.time()
        _say(event="began", at=result["began_at"])
        try:
            with conn.begin() as tx:
                job_id = queue.enqueue(
                    conn, JOB_TYPE, {"pid": os.getpid()}, idempotency_key=args.key, external=True
                )
                result["id"] = job_id
                result["enqueued_at"] = time.time()
                _say(event="enqueued", id=job_id, at=result["enqueued_at"])
                if args.hold and sys.stdin.readline().strip() != "end":
                    raise RuntimeError("expected 'end' on stdin")
                result["ending_at"] = time.time()
                if args.mode == "commit":
                    tx.commit()
                else:
                    tx.rollback()
        except Exception as error:
            result["error"] = f"{type(error).__module__}.{type(error).__qualname__}: {error}"
        result["ended_at"] = time.time()
        _say(**result)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
