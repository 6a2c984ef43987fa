"""The worker's quick payload check agrees with ``inspect.Signature.bind`` on every shape of
handler: when it says a payload fits, binding succeeds; where it is unsure, binding decides."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import sqlqueue


def _plain(a: int, b: int = 2) -> None: ...
def _keyword_only(a: int, *, c: int, d: int = 4) -> None: ...
def _any_keywords(a: int, **extra: Any) -> None: ...
def _star_args(a: int, *args: Any) -> None: ...
def _positional_only(a: int, /, b: int = 2) -> None: ...
def _with_context(ctx: sqlqueue.JobContext, a: int) -> None: ...
def _nothing() -> None: ...


HANDLERS = [_plain, _keyword_only, _any_keywords, _star_args, _positional_only, _with_context]
HANDLERS.append(_nothing)
NAMES = ["a", "b", "c", "d", "args", "extra", "ctx", "zzz"]
PAYLOADS = [dict.fromkeys(combo, 1) for n in range(4) for combo in itertools.combinations(NAMES, n)]


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda h: h.__name__)
def test_the_quick_check_never_accepts_what_binding_refuses(handler: Any, tmp_path) -> None:
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'unopened.db'}")
    task = queue.task("t")(handler)
    context = task.context_parameter
    quick = 0
    for payload in PAYLOADS:
        extra = {context: None} if context else {}
        try:
            if context in payload:
                raise TypeError("the context is not a payload field")
            task.signature.bind(**payload, **extra)
            binds = True
        except TypeError:
            binds = False
        fits = task.payload_fits(payload) and context not in payload
        assert not fits or binds, (handler.__name__, payload)
        if handler is not _positional_only:
            assert fits == binds, (handler.__name__, payload)  # the quick check decides alone
        quick += fits
    assert quick or handler is _positional_only, "some payloads take the quick path"
