"""A worker process for the fault tests: ``python -m tests.apps.fault_worker [worker options]``.

Runs ``sqlqueue worker tests.apps.fault_app:queue [worker options]`` after installing what the
environment asks for: first the clock skew (``FAULT_CLOCK_SKEW_SECONDS``, before sqlqueue is
imported), then the hooks of :mod:`tests.apps.fault_hooks`, then (``FAULT_ENQUEUE_JOBS``) an
enqueuer thread. It prints one ``fault hooks: …`` line saying what is on.
"""

from __future__ import annotations

import os
import sys

APP = "tests.apps.fault_app:queue"


def main() -> int:
    """Install the faults, then run the sqlqueue worker command."""
    installed: list[str] = []
    skew = os.environ.get("FAULT_CLOCK_SKEW_SECONDS")
    if skew:
        from tests.apps.fault_clock import install_skew

        install_skew(float(skew))
        installed.append(f"clock skewed by {float(skew):+g} s")

    from sqlqueue.cli import main as sqlqueue_main
    from tests.apps import fault_hooks

    installed += fault_hooks.install_from_environment()  # before the app makes its engine
    from tests.apps.fault_app import queue

    jobs = os.environ.get("FAULT_ENQUEUE_JOBS")
    if jobs:
        fault_hooks.start_enqueuer(
            queue, int(jobs), start_file=os.environ.get("FAULT_ENQUEUE_START_FILE")
        )
        installed.append(f"enqueuing {jobs} jobs")
    print(f"fault hooks: {', '.join(installed) or 'none'}", flush=True)
    return sqlqueue_main(["worker", APP, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
