"""A process that requeues dead jobs by filter once a start file appears, for the race test.

``python -m tests.apps.requeuer START_FILE`` with ``SQLQUEUE_DATABASE_URL`` set; says it is ready
(a file ``START_FILE.ready.PID``), then prints how many jobs it requeued.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import sqlqueue


def main() -> None:
    start = Path(sys.argv[1])
    queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"])
    start.with_name(f"{start.name}.ready.{os.getpid()}").touch()
    while not start.exists():
        time.sleep(0.005)
    new_ids = queue.requeue_where(by=f"pid {os.getpid()}", reason="race", batch_size=20)
    print(len(new_ids))


if __name__ == "__main__":
    main()
