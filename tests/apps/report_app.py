"""The activity report example's queue, for the report tests' worker processes.

``python -m sqlqueue worker tests.apps.report_app:queue`` serves the example's tasks
(``examples/activity_report.py``, loaded from its file: examples are programs, not a package)
with the test's settings from the environment: ``REPORT_SCHEDULE=1`` keeps the nightly cron
schedule (off by default, so a test starts its runs itself), ``REPORT_LEASE_SECONDS`` a short
lease for the crash test, ``REPORT_THROTTLE_SECONDS`` slows each chunk down so a test can act
while it runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import sqlqueue
from tests.apps import UNOPENED_DATABASE

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "activity_report.py"


def load_example() -> ModuleType:
    """``examples/activity_report.py`` as the module ``activity_report`` (loaded once)."""
    loaded = sys.modules.get("activity_report")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("activity_report", EXAMPLE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


example = load_example()
queue: sqlqueue.Queue = example.build_queue(
    os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE),
    schedule=os.environ.get("REPORT_SCHEDULE") == "1",
    lease_seconds=float(os.environ.get("REPORT_LEASE_SECONDS", "60")),
    throttle_seconds=float(os.environ.get("REPORT_THROTTLE_SECONDS", "0")),
)
