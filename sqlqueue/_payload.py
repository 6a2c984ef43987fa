"""Payload checks: a job's payload is a small JSON object of plain values, checked before any SQL.

Checking up front keeps the promise "bad input gets a clear error and loses nothing": no row is
written and the caller's transaction is untouched. The error names the offending path.
"""

from __future__ import annotations

import json
import json.encoder
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlqueue._errors import PayloadError

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_DEPTH",
    "MAX_INT",
    "check_payload",
    "check_result",
    "encode_payload",
]

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
#: Deeper payloads are almost always a mistake (a graph, not ids and options).
MAX_DEPTH = 32
#: Floats from here on are whole numbers that PostgreSQL's jsonb stores as the decimal digits
#: of their shortest form (``1.8237199422851508e16`` reads back as ``18237199422851510``, an int
#: that differs): payloads refuse them, so a payload reads back as it was written everywhere.
EXACT_FLOAT = 2.0**53
#: Integers of more digits than Python converts to text (its ``int_max_str_digits``, 4300)
#: cannot be written as JSON at all: refused by name, not with the converter's bare ValueError.
MAX_INT = 10**4299
#: Compact JSON, UTF-8 text as it is, no NaN: the form payloads are measured and stored in
#: (the SQLite bulk path binds its JSON documents with it too).
JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _unencodable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _fast_encoder() -> Callable[[Any], str]:
    """``JSON_ENCODER.encode`` for values already walked by :func:`_plain` (acyclic, bounded), by
    the C encoder it wraps, made once instead of per call: half the cost per payload."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - a Python without the C accelerator
        return JSON_ENCODER.encode
    chunks = make(
        None, _unencodable, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    return lambda value: "".join(chunks(value, 0))


_encode_plain = _fast_encoder()
#: How an encoded NUL character looks (or a string holding a backslash and "u0000").
_ENCODED_NUL = "\\u0000"


def encode_payload(payload: Mapping[str, Any] | None, *, max_bytes: int) -> str:
    """``payload`` encoded as JSON text, once checked to be storable within ``max_bytes``.

    The common payload (a dict of plain values) is walked once by type, encoded once, and its
    text checked for what the walk skipped (NaN, NUL, lone surrogates); anything unusual takes
    the full check, which names the offending path.
    """
    if payload is None:
        return "{}"
    if type(payload) is dict and _plain(payload, 0):
        try:
            text = _encode_plain(payload)
        except ValueError:  # NaN or infinity: the full check names where
            pass
        else:
            if _ENCODED_NUL not in text:
                if text.isascii():
                    size = len(text)
                else:
                    try:
                        size = len(text.encode("utf-8"))
                    except UnicodeEncodeError:  # a lone surrogate: the full check names where
                        size = -1
                if 0 <= size <= max_bytes:
                    return text
    check_payload(payload, max_bytes=max_bytes)
    return JSON_ENCODER.encode(payload)


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
        exact_floats=True,
    )
    return dict(payload)


def check_result(result: Any, *, max_bytes: int) -> Any:
    """``result`` once checked to be storable JSON (any JSON value) within ``max_bytes``, with
    no float beyond 2**53 (PostgreSQL gave one back as other digits: see :data:`EXACT_FLOAT`)."""
    if result is None:
        return None
    _check_json(
        result,
        "result",
        max_bytes,
        "keep large outputs in your own tables and return their ids (or raise max_result_bytes)",
        exact_floats=True,  # read back as written, as a payload is (PostgreSQL's jsonb)
    )
    return result


def _check_json(
    value: Any, what: str, max_bytes: int, advice: str, *, exact_floats: bool = False
) -> None:
    """Plain JSON values only (with ``exact_floats``, no float beyond :data:`EXACT_FLOAT`), and
    at most ``max_bytes`` once encoded as UTF-8."""
    _check_value(value, what, 0, exact_floats)
    size = len(JSON_ENCODER.encode(value).encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(f"the {what} is {size} bytes, over the {max_bytes}-byte cap: {advice}")


def _plain(value: dict[Any, Any] | list[Any], depth: int) -> bool:
    """Whether ``value`` holds only dicts with string keys, lists and JSON scalars, within
    :data:`MAX_DEPTH` (exact types: anything else, or the depth limit, takes the full check)."""
    if depth >= MAX_DEPTH:
        return False
    items: Iterable[Any] = value
    if type(value) is dict:
        for key in value:
            if type(key) is not str:
                return False
        items = value.values()
    for item in items:
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int and -MAX_INT < item < MAX_INT:
            continue
        if kind is float and -EXACT_FLOAT < item < EXACT_FLOAT:  # not NaN, inf or beyond
            continue
        if (kind is dict or kind is list) and _plain(item, depth + 1):
            continue
        return False
    return True


def _check_value(value: Any, path: str, depth: int, exact_floats: bool) -> None:
    if depth > MAX_DEPTH:
        raise PayloadError(f"{path} is nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -MAX_INT < value < MAX_INT:
            raise PayloadError(
                f"{path} is an integer of over 4,300 digits, more than JSON is written "
                "with here: store it as text"
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path} is {value!r}, which JSON cannot represent")
        if exact_floats and not -EXACT_FLOAT < value < EXACT_FLOAT:
            raise PayloadError(
                f"{path} is the float {value!r}, beyond 2**53: it would not read back as "
                "written (PostgreSQL stores it as other whole-number digits); pass an int"
            )
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
            _check_value(item, f"{path}[{key!r}]", depth + 1, exact_floats)
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_value(item, f"{path}[{index}]", depth + 1, exact_floats)
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
