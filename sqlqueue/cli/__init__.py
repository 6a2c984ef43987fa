"""The ``sqlqueue`` command line: ``main`` is the console script and ``python -m sqlqueue``;
``build_parser()`` is its argparse parser (every command, option and help text), from which the
reference of the command line is generated.

Inside: ``_parser`` (the parser), ``_main`` (parse, map errors to exit codes), ``_run`` (the
parsed command run, ``migrate`` among them: imported only after the parse, so ``--version`` and
``--help`` load no SQLAlchemy), ``_worker_cmd`` (``worker``), ``_ops`` (the reading commands:
``stats``, ``health``, ``jobs``, ``batch``), ``_act`` (the acting ones: ``dead``, ``cancel``,
``prune``, ``pause``, ``resume``, ``limit``), ``_web_cmd`` (``web``), ``_text`` (tables,
durations and job details as text), ``_common`` (exit codes, the usage error) and ``_engine``
(the database URL made into an engine, or a one-line answer naming the fix).
"""

from __future__ import annotations

from sqlqueue.cli._main import main
from sqlqueue.cli._parser import build_parser

__all__ = ["build_parser", "main"]
