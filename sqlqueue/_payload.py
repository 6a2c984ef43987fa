"""Payload checks: a job's payload is a small JSON object of plain values, checked before any SQL.

Checking up front keeps the promise "bad input gets a clear error and loses nothing": no row is
written and the caller's transaction is untouched. The error names the offending path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from sqlqueue._errors import PayloadError

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "MAX_DEPTH", "check_payload", "check_result"]

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
#: Deeper payloads are almost always a mistake (a graph, not ids and options).
MAX_DEPTH = 32


def check_payload(payload: Mapping[str, Any] | None, *, max_bytes: int) -> dict[str, Any]:
    """``payload`` as a plain dict, once checked to be storable JSON within ``max_bytes``."""
    if payload is None:
        return {}
    if not isinstance(payload, Mapping):
        raise PayloadError(
            f"the payload must be a mapping of argument names to JSON values, "
            f"got {type(payload).__name__}"
        )
    _check_json(
        payload,
        "payload",
        max_bytes,
        "store ids and options in the job, and large data in your own tables "
        "(or raise max_payload_bytes)",
    )
    return dict(payload)


def check_result(result: Any, *, max_bytes: int) -> Any:
    """``result`` once checked to be storable JSON (any JSON value) within ``max_bytes``."""
    if result is None:
        return None
    _check_json(
        result,
        "result",
        max_bytes,
        "keep large outputs in your own tables and return their ids (or raise max_result_bytes)",
    )
    return result


def _check_json(value: Any, what: str, max_bytes: int, advice: str) -> None:
    """Plain JSON values only, and at most ``max_bytes`` once encoded as UTF-8."""
    _check_value(value, what, 0)
    encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    size = len(encoded.encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(f"the {what} is {size} bytes, over the {max_bytes}-byte cap: {advice}")


def _check_value(value: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise PayloadError(f"{path} is nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, str):
        _check_text(value, path)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"{path} has a key {key!r} of type {type(key).__name__}; JSON keys are strings"
                )
            _check_text(key, f"a key of {path}")
            _check_value(item, f"{path}[{key!r}]", depth + 1)
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_value(item, f"{path}[{index}]", depth + 1)
        return
    raise PayloadError(
        f"{path} is a {type(value).__name__}; only JSON values can be stored "
        "(str, int, float, bool, None, list, dict) — convert it, e.g. a datetime to ISO text"
    )


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise PayloadError(f"{path} contains a NUL character, which databases cannot store in JSON")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PayloadError(f"{path} is not valid Unicode text ({error.reason})") from None
