"""The activity report example as the report benchmark and its workers load it.

``examples/activity_report.py`` is a program, not a package: it is loaded from its file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["EXAMPLE", "SINGLE", "load_example"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "activity_report.py"
#: The single-job report (``bench.report_app``): one job reads every event and writes the CSV.
SINGLE = "activity_report_single"


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
