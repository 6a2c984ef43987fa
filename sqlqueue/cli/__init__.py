"""The ``sqlqueue`` command line: ``main`` is the console script and ``python -m sqlqueue``."""

from __future__ import annotations

from sqlqueue.cli._main import main

__all__ = ["main"]
