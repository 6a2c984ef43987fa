"""Parsing Python source in a test process that has other threads running."""

from __future__ import annotations

import ast
import gc


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` that another thread cannot interrupt halfway.

    CPython before 3.11.8 keeps the AST constructor's recursion counter in one state shared by
    every thread (gh-106905): when a collection runs a finalizer halfway through building the
    tree, another thread may switch in and parse too (3.11's tracebacks parse the failing line
    to place their carets), and the first parse then fails with ``SystemError: AST constructor
    recursion depth mismatch``. With the collector off, building the tree runs no Python code,
    so it never lets go of the GIL."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if enabled:
            gc.enable()
