"""A writer to be SIGKILLed mid-transaction: ``python -m tests.apps.fault_writer N``.

Takes the database's write lock (the queue's own ``begin_write``), enqueues N jobs keyed
``doomed:<n>`` in that transaction, prints ``holding`` and waits to be killed, never committing.
"""

from __future__ import annotations

import os
import sys
import time

import sqlqueue
from tests.apps.fault_tasks import register_fault_tasks


def main() -> int:
    """Write without committing, then wait for the SIGKILL."""
    count = int(sys.argv[1])
    queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"])
    register_fault_tasks(queue)
    with queue.engine.connect() as conn:
        queue.dialect.begin_write(conn)
        queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="fault.noop", idempotency_key=f"doomed:{n}")
                for n in range(count)
            ],
        )
        print("holding", flush=True)
        time.sleep(600)
    return 1


if __name__ == "__main__":
    sys.exit(main())
