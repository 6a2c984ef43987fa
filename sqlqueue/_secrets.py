"""Secrets at rest: the payload fields a task declares secret are encrypted before their row is
written, decrypted only into the handler's arguments, and shown as ``"***"`` everywhere else.

A sealed value is stored as ``{"$sqlqueue_secret": "v1:<Fernet token>"}``; the token holds
the value's JSON text, so a secret of any JSON type comes back with its type. A
:class:`Keyring` holds the queue's keys (``cryptography``'s MultiFernet: the first key
encrypts, every key decrypts, so keys rotate by putting a new one first). A task's
:class:`SecretFields` seals a payload at enqueue, opens the handler's arguments, and gives
the :class:`Redactor` that scrubs the plaintext out of whatever the attempt stores (its
error, traceback, details and result). ``cryptography`` is imported only when a queue has
keys: plain queues never load it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlqueue._errors import ConfigurationError, PayloadError, PermanentError
from sqlqueue._payload import JSON_ENCODER
from sqlqueue._scrub import REDACTED, storable, url_encoded

__all__ = [
    "ENV_KEYS",
    "MARKER",
    "REDACTED",
    "Keyring",
    "Redacted",
    "Redactor",
    "SecretFields",
    "SecretKeyMissing",
    "keyring_from",
    "redacted",
    "secret_fields_for",
]

#: The key of the one-entry object a sealed value is stored as.
MARKER = "$sqlqueue_secret"
#: The environment variable read when ``Queue(encryption_keys=...)`` is not given.
ENV_KEYS = "SQLQUEUE_ENCRYPTION_KEYS"
_VERSION = "v1:"
_GENERATE = (
    "generate one with: python -c "
    '"from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
)


class SecretKeyMissing(PermanentError):
    """No key of this worker decrypts a secret field of the job: the key it was sealed with is
    missing or was rotated out. Retrying cannot help, so the job goes dead saying so."""


@dataclass(frozen=True, eq=False)
class Keyring:
    """The keys secrets are sealed and opened with: the first encrypts, all decrypt."""

    #: A ``cryptography.fernet.MultiFernet`` (typed loosely: the package is optional).
    fernet: Any
    #: ``cryptography.fernet.InvalidToken``: what a token no key opens raises.
    invalid: type[Exception]
    size: int
    #: One HMAC key per encryption key, in their order, derived from it (never the key
    #: itself): what a key derived from a secret field is hashed with (see :meth:`digests`).
    digest_keys: tuple[bytes, ...] = ()

    def seal(self, value: Any) -> dict[str, str]:
        """``value`` (any JSON value) as its stored, encrypted form."""
        token: bytes = self.fernet.encrypt(JSON_ENCODER.encode(value).encode("utf-8"))
        return {MARKER: _VERSION + token.decode("ascii")}

    def open(self, sealed: Mapping[str, Any]) -> Any:
        """The value :meth:`seal` sealed; raises ``self.invalid`` when no key opens it."""
        text = sealed[MARKER]
        if not isinstance(text, str) or not text.startswith(_VERSION):
            raise self.invalid
        try:
            return json.loads(self.fernet.decrypt(text[len(_VERSION) :].encode("ascii")))
        except ValueError:  # not ASCII, or not JSON: not a token this code wrote
            raise self.invalid from None

    def digests(self, text: str) -> tuple[str, ...]:
        """The HMAC-SHA256 of ``text`` (hex) under each key's digest key, the current (first)
        key's first: what is stored in place of a key derived from a secret field, and the
        ones it was stored as before the keys last rotated."""
        data = text.encode("utf-8", "surrogatepass")
        return tuple(hmac.new(key, data, hashlib.sha256).hexdigest() for key in self.digest_keys)


def keyring_from(
    keys: Sequence[str | bytes] | None, environ: Mapping[str, str] = os.environ
) -> Keyring | None:
    """The keyring of ``Queue(encryption_keys=keys)``: ``None`` reads the comma-separated
    :data:`ENV_KEYS` variable; no keys at all means no keyring. A malformed key is named by
    its position, never echoed."""
    field = "encryption_keys"
    if keys is None:
        keys = [key.strip() for key in environ.get(ENV_KEYS, "").split(",") if key.strip()]
        field = ENV_KEYS
    elif isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise ConfigurationError(
            f"encryption_keys must be a list of Fernet keys (the first encrypts, all decrypt), "
            f"got a {type(keys).__name__}"
        )
    if not keys:
        return None
    try:
        from cryptography.fernet import Fernet, InvalidToken, MultiFernet
    except ImportError:
        raise ConfigurationError(
            f"{field}: secrets at rest need the cryptography package: "
            "pip install 'sqlalchemy-sqlqueue[secrets]'"
        ) from None
    fernets = []
    for index, key in enumerate(keys):
        try:
            fernets.append(Fernet(key))
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"{field}: key #{index + 1} is not a Fernet key (32 url-safe base64-encoded "
                f"bytes); {_GENERATE}"
            ) from None
    return Keyring(
        fernet=MultiFernet(fernets),
        invalid=InvalidToken,
        size=len(fernets),
        digest_keys=tuple(_digest_key(key) for key in keys),
    )


#: What a digest key is derived for: it is not the encryption key, nor usable as one.
_DIGEST_PURPOSE = b"sqlqueue v1: the keyed hash of a key derived from a secret field"


def _digest_key(key: str | bytes) -> bytes:
    """The HMAC key derived from the Fernet key ``key`` (already checked to be one): an HMAC
    of a fixed purpose under its 32 bytes, so the digests say nothing of the key."""
    raw = base64.urlsafe_b64decode(key.encode("ascii") if isinstance(key, str) else key)
    return hmac.new(raw, _DIGEST_PURPOSE, hashlib.sha256).digest()


def _is_sealed(value: Any) -> bool:
    return type(value) is dict and len(value) == 1 and MARKER in value


def redacted(document: Any) -> Any:
    """``document`` (a stored payload) with every sealed value shown as :data:`REDACTED`; the
    same object when it holds none, so reading plain rows copies nothing."""
    if type(document) is dict:
        if _is_sealed(document):
            return REDACTED
        changed = None
        for key, item in document.items():
            if type(item) is dict or type(item) is list:
                shown = redacted(item)
                if shown is not item:
                    if changed is None:
                        changed = dict(document)
                    changed[key] = shown
        return document if changed is None else changed
    if type(document) is list:
        shown_items = [redacted(item) for item in document]
        if any(shown is not item for shown, item in zip(shown_items, document, strict=True)):
            return shown_items
    return document


@dataclass(frozen=True, eq=False)
class Redactor:
    """Scrubs the plaintext of one job's secrets out of what its attempt stores."""

    #: The numbers among the secrets (and inside secret objects), matched by value.
    numbers: tuple[int | float, ...]
    #: The texts a secret may show up as in a message, longest first.
    needles: tuple[str, ...]

    @classmethod
    def of(cls, values: Iterable[Any]) -> Redactor:
        """A redactor for ``values``: a string as it is (and escaped as ``repr``, ``ascii``,
        the ``repr`` of its UTF-8 bytes, JSON and :func:`~sqlqueue._scrub.storable` would: the
        forms an exception's args and a ``repr`` quote it in), a number as text, an object or
        list as a whole and by each of its strings and numbers. ``true``/``false``/``null``
        are no secret worth garbling every message for."""
        numbers: list[int | float] = []
        needles: set[str] = set()
        for value in values:
            if isinstance(value, dict | list):
                needles.update((JSON_ENCODER.encode(value), repr(value)))
            for leaf in _leaves(value):
                if isinstance(leaf, str):
                    needles.update(
                        (
                            leaf,
                            storable(leaf),
                            repr(leaf)[1:-1],
                            ascii(leaf)[1:-1],  # ``%a``, ``ascii()``: \x, \u escapes
                            repr(leaf.encode("utf-8", "surrogatepass"))[2:-1],  # as bytes
                            JSON_ENCODER.encode(leaf)[1:-1],
                            json.dumps(leaf)[1:-1],  # ASCII-only JSON: \u escapes
                        )
                    )
                    needles.update(url_encoded(leaf))  # as an HTTP library puts it in a URL
                elif isinstance(leaf, int | float) and not isinstance(leaf, bool):
                    numbers.append(leaf)
                    needles.update((repr(leaf), JSON_ENCODER.encode(leaf)))
        needles.discard("")
        return cls(numbers=tuple(numbers), needles=tuple(sorted(needles, key=len, reverse=True)))

    def text(self, text: str) -> str:
        """``text`` with every occurrence of a secret replaced by :data:`REDACTED`. The places
        are found in the text as given, every occurrence of every secret, overlapping ones
        too, and each run they cover becomes one marker: replacing one secret at a time could
        split another that overlaps it and leave part of it in the clear."""
        spans: list[tuple[int, int]] = []
        for needle in self.needles:
            start = text.find(needle)
            while start != -1:
                spans.append((start, start + len(needle)))
                start = text.find(needle, start + 1)
        if not spans:
            return text
        spans.sort()
        pieces: list[str] = []
        kept_from = 0
        run_start, run_end = spans[0]
        for start, end in spans[1:]:
            if start <= run_end:
                run_end = max(run_end, end)
                continue
            pieces += (text[kept_from:run_start], REDACTED)
            kept_from, run_start, run_end = run_end, start, end
        pieces += (text[kept_from:run_start], REDACTED, text[run_end:])
        return "".join(pieces)

    def value(self, value: Any) -> Any:
        """``value`` (a result, an error's details: anything a handler hands back) with the
        secrets in it redacted, keys as well as values and whatever their types, *before*
        anything is made storable (a key ``str()``-ed first would keep the secret it holds):
        strings and bytes get their secrets' text replaced, a number equal to a secret becomes
        :data:`REDACTED`, lists, tuples, sets and mappings are walked (a tuple or set key stays
        one, so it still hashes), and an exception is shown by its args, redacted. Anything
        else whose ``repr`` quotes a secret becomes a :class:`Redacted` showing it scrubbed.
        What is not JSON stays not JSON: the caller's check refuses it as before."""
        if not self.needles:
            return value
        return self._walk(value, 0)

    def _walk(self, value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes | bytearray):
            return self._bytes(value)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            if any(type(value) is type(secret) and value == secret for secret in self.numbers):
                return REDACTED
            return value
        if depth >= _MAX_WALK:  # a cycle, or nesting no store takes: shown as neither
            return Redacted(f"<{type(value).__name__} nested over {_MAX_WALK} levels>")
        inner = depth + 1
        if isinstance(value, Mapping):
            walked: dict[Any, Any] = {}
            for key, item in value.items():
                shown = self._walk(key, inner)
                if shown in walked:  # two keys redacted alike: the later one numbered, kept
                    shown = _numbered(shown, walked)
                walked[shown] = self._walk(item, inner)
            return walked
        if isinstance(value, list):
            return [self._walk(item, inner) for item in value]
        if isinstance(value, tuple):
            return tuple(self._walk(item, inner) for item in value)
        if isinstance(value, frozenset):
            return frozenset(self._walk(item, inner) for item in value)
        if isinstance(value, set):
            return {self._walk(item, inner) for item in value}
        if isinstance(value, BaseException):
            name = type(value).__name__
            args = [self._walk(arg, inner) for arg in value.args]
            shown = self.text(f"{name}({', '.join(_repr(arg) for arg in args)})")
            if shown == f"{name}({', '.join(_repr(arg) for arg in value.args)})":
                return value  # no secret in its args: the exception itself, as it was
            return Redacted(shown)
        shown = _repr(value)
        scrubbed = self.text(shown)
        return value if scrubbed == shown else Redacted(scrubbed)

    def _bytes(self, data: bytes | bytearray) -> bytes | bytearray:
        """``data`` with its secrets' UTF-8 text replaced by :data:`REDACTED` (the same object
        when it holds none)."""
        text = bytes(data).decode("utf-8", "surrogateescape")
        shown = self.text(text)
        if shown == text:
            return data
        return shown.encode("utf-8", "surrogateescape")


#: How deep :meth:`Redactor.value` walks: past it (a cycle, or nesting no store would take),
#: a value is shown by its type alone.
_MAX_WALK = 100


class Redacted:
    """What :meth:`Redactor.value` puts in place of an object that is not plain data (an
    exception, an object whose ``repr`` quotes a secret): its ``repr``, scrubbed. Only that
    text is kept; ``str()`` and ``repr()`` give it."""

    __slots__ = ("shown",)

    def __init__(self, shown: str) -> None:
        self.shown = shown

    def __repr__(self) -> str:
        return self.shown

    __str__ = __repr__


def _numbered(key: Any, taken: Mapping[Any, Any]) -> Any:
    """``key`` (a redacted key another one was redacted to as well) made distinct: ``*** #2``."""
    number = 2
    while True:
        shown = f"{key} #{number}" if isinstance(key, str) else Redacted(f"{_repr(key)} #{number}")
        if shown not in taken:
            return shown
        number += 1


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a repr that fails still leaves something to show
        return f"<unprintable {type(value).__name__}>"


def _leaves(value: Any) -> Iterator[Any]:
    """The scalars of a JSON value, depth first."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


@dataclass(frozen=True, eq=False)
class SecretFields:
    """One task's secret fields (dotted paths into its payload) and the keys that seal them."""

    paths: tuple[tuple[str, ...], ...]
    keyring: Keyring

    def seal(self, payload: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """``payload`` with each secret field present replaced by its sealed form (copied
        along the paths only; the caller's payload is left as it is)."""
        if not isinstance(payload, Mapping):
            return payload  # None, or something the payload check rejects with its own words
        sealed: Mapping[str, Any] = payload
        for path in self.paths:
            sealed = _replaced(sealed, path, self._sealer(path))
        return sealed

    def _sealer(self, path: tuple[str, ...]) -> Callable[[Any], Any]:
        def seal(value: Any) -> Any:
            try:
                return self.keyring.seal(value)
            except (TypeError, ValueError) as error:
                raise PayloadError(
                    f"secret field {'.'.join(path)!r} must hold a JSON value: {error}"
                ) from None

        return seal

    def open(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], Redactor]:
        """The handler's arguments with each sealed field decrypted, and the redactor of the
        plaintexts; :class:`SecretKeyMissing` when no key opens one. A field stored in the
        clear (enqueued before it was declared secret) is passed on, and redacted too."""
        opened, values = self._opened(kwargs, strict=True)
        return dict(opened), Redactor.of(values)

    def opened(self, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """``payload`` (a claimed job's) with its sealed fields decrypted: the plaintext view
        every key function gets; :class:`SecretKeyMissing` when no key opens one."""
        return self._opened(payload, strict=True)[0]

    def stood_in(self, payload: Mapping[str, Any], stand_in: Any) -> Mapping[str, Any]:
        """``payload`` with each secret field present replaced by ``stand_in`` (copied along
        the paths); ``payload`` itself when it holds none."""
        for path in self.paths:
            payload = _replaced(payload, path, lambda _value: stand_in)
        return payload

    def redactor(self, payload: Mapping[str, Any]) -> Redactor:
        """The redactor of ``payload``'s secrets, for an attempt that failed: whatever no key
        opens is left out (it never reached the handler, so it cannot be in its error)."""
        return Redactor.of(self._opened(payload, strict=False)[1])

    def _opened(
        self, document: Mapping[str, Any], *, strict: bool
    ) -> tuple[Mapping[str, Any], list[Any]]:
        """``document`` with its sealed fields opened, in the reverse order of :meth:`seal`
        (a field sealed inside another opens once the outer one has), and their plaintexts."""
        values: list[Any] = []
        for path in reversed(self.paths):
            document = _replaced(document, path, self._opener(path, values, strict))
        return document, values

    def _opener(
        self, path: tuple[str, ...], values: list[Any], strict: bool
    ) -> Callable[[Any], Any]:
        def open_one(value: Any) -> Any:
            if _is_sealed(value):
                try:
                    value = self.keyring.open(value)
                except self.keyring.invalid:
                    if not strict:
                        return value
                    raise SecretKeyMissing(
                        f"no encryption key of this worker decrypts secret field "
                        f"{'.'.join(path)!r}: the key it was encrypted with is missing or was "
                        f"rotated out ({self.keyring.size} key(s) configured); add that key "
                        f"to encryption_keys or {ENV_KEYS} after the current one, then requeue "
                        "the job"
                    ) from None
            values.append(value)
            return value

        return open_one


def _replaced(
    document: Mapping[str, Any], path: tuple[str, ...], change: Callable[[Any], Any]
) -> Mapping[str, Any]:
    """``document`` with ``change`` applied to the value at ``path`` (copied along the path), or
    ``document`` itself when the path is not there: an absent secret field is fine."""
    head = path[0]
    if head not in document:
        return document
    current = document[head]
    if len(path) == 1:
        new = change(current)
    elif isinstance(current, Mapping):
        new = _replaced(current, path[1:], change)
        if new is current:
            return document
    else:
        return document
    copy = dict(document)
    copy[head] = new
    return copy


def secret_fields_for(
    task: str, fields: Iterable[str] | None, keyring: Keyring | None
) -> SecretFields | None:
    """Task ``task``'s :class:`SecretFields`, checked when it is registered: dotted paths of
    names, and a queue with encryption keys to seal them with."""
    if fields is None:
        return None
    if isinstance(fields, str):
        raise ConfigurationError(
            f"task {task!r}: secret_fields must be a list of dotted paths, e.g. [{fields!r}]"
        )
    paths: list[tuple[str, ...]] = []
    for dotted in fields:
        if not isinstance(dotted, str) or not all(dotted.split(".")):
            raise ConfigurationError(
                f"task {task!r}: secret_fields holds {dotted!r}; each is a dotted path of "
                "payload keys, e.g. 'token' or 'card.number'"
            )
        path = tuple(dotted.split("."))
        if path not in paths:
            paths.append(path)
    if not paths:
        return None
    if keyring is None:
        raise ConfigurationError(
            f"task {task!r} has secret_fields but its queue has no encryption keys: pass "
            f"Queue(encryption_keys=[...]) or set {ENV_KEYS}; {_GENERATE}"
        )
    return SecretFields(paths=tuple(paths), keyring=keyring)
