"""The enqueue-time argument check: a payload must bind to its task's handler.

A job whose payload does not fit its handler (a misspelt keyword, a missing argument) would
otherwise be written, claimed and sent to ``dead`` with ``PayloadMismatch`` long after the
code that enqueued it returned. Checking here turns that into a :class:`PayloadError` at the
call, before any SQL. Jobs of types this process has no task for (``external=True``) are not
checked: their handler lives elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlqueue._errors import PayloadError
from sqlqueue._task import Task

__all__ = ["check_arguments"]


def check_arguments(task: Task, payload: Mapping[str, Any] | None) -> None:
    """Raise :class:`PayloadError` (an ``EnqueueError``), saying why, unless ``payload`` binds
    to ``task``'s handler as keyword arguments. A payload that is not a mapping of string
    keys is left to the payload encoder, which says what is wrong with it."""
    if payload is None:
        payload = {}
    elif not isinstance(payload, Mapping):
        return
    context = task.context_parameter
    if task.payload_fits(payload) and (context is None or context not in payload):
        return  # the common case: set arithmetic, no binding
    if not all(isinstance(key, str) for key in payload):
        return
    try:
        if context is not None and context in payload:
            raise TypeError(f"{context!r} is the handler's JobContext, not a payload field")
        task.signature.bind(**payload, **({context: None} if context else {}))
    except TypeError as error:
        parameters = ", ".join(
            str(parameter.replace(annotation=parameter.empty))
            for name, parameter in task.signature.parameters.items()
            if name != context
        )
        raise PayloadError(
            f"the payload does not fit {task.name}({parameters}): {error}; nothing was enqueued"
        ) from None
