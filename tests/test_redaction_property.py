"""Redaction as a property: for random secrets in random text of random length, no run of six
or more characters of a secret is in anything stored or logged of its job.

The unit property drives :func:`~sqlqueue._scrub.clip` with cuts anywhere; the worker property
drives a real worker on each backend: a handler puts the secrets, surrounded by random text whose
length puts them across each cut (the message's 2,000 characters, the traceback's and details'
8,000), into its error, its traceback, its ``Retry``/``PermanentError`` details (small, too
large, not JSON) and its result; then every column of the job row, every log record and every
span (attributes, events, status) is read.
Two secret fields that overlap in the text are tried too: redacting one at a time split the
other. The progress note is the app's own text (documented) and is not looked at.

The shapes properties (issue 44, item 1) put the secrets — a text, a card number as text and a
number — where a walk over string values alone misses them: in keys (text, bytes, tuples,
frozensets, the number itself), bytes, tuples, nested containers and exception args, in the
details of a ``Retry`` and a ``PermanentError``, in a result and in the args of a raised
error; then no 8-character slice of a secret may be in the row, the log, the spans, the
output of ``sqlqueue jobs show --json`` or the web page's job page. A unit property drives
:meth:`~sqlqueue._secrets.Redactor.value` alone, with many more shapes.
"""

from __future__ import annotations

import html
import json
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from hypothesis import assume, example, given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue._scrub import clip, storable
from sqlqueue._secrets import Redactor
from sqlqueue.web import create_app
from tests._support import drain, run_cli
from tests._support.web import browser_client
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(600)

WINDOW = 6
#: A secret's characters: any, but the marker's ``*``, the padding's ``x``, the framing a
#: traceback draws (indents, carets) and ASCII digits (timestamps and ids in every record):
#: those would be "found" where no secret put them. Numbers as secrets: tests/test_secrets.py.
SECRET_CHARS = st.characters(
    codec="utf-8", exclude_categories=["Cs"], exclude_characters="*x ^~\r0123456789"
)
SECRETS = st.text(SECRET_CHARS, min_size=WINDOW, max_size=40)
#: Where a secret lands: at the start, across the message's cut, across the 8,000-character
#: cuts of the traceback and the details (both sides).
OFFSETS = st.one_of(
    st.integers(0, 40),
    st.integers(1_960, 2_010),
    st.integers(7_940, 8_010),
)


def windows(secret: str) -> set[str]:
    """Every run of :data:`WINDOW` characters of ``secret``, as it is and as repr, JSON and
    ASCII JSON escape it (the forms a stored text can quote it in)."""
    runs = {secret[i : i + WINDOW] for i in range(len(secret) - WINDOW + 1)}
    return {
        form
        for run in runs
        for form in (
            run,
            repr(run)[1:-1],
            json.dumps(run, ensure_ascii=False)[1:-1],
            json.dumps(run)[1:-1],
        )
    }


def surrounding(draw: st.DrawFn, secrets: list[str], length: int) -> str:
    """Random text of about ``length`` characters that holds no window of the secrets."""
    text = draw(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30))
    text += "x" * max(0, length - 30)
    assume(not any(window in text for secret in secrets for window in windows(secret)))
    return text


def leaks(secrets: list[str], texts: list[str]) -> list[str]:
    return sorted(
        {
            window
            for secret in secrets
            for window in windows(secret)
            for text in texts
            if window in text
        }
    )


# -- the cut itself ------------------------------------------------------------------------------


@st.composite
def cut_cases(draw: st.DrawFn) -> tuple[list[str], str, int, str]:
    """Secrets in random text, with parts of them too (a secret's start or end alone, as a
    text cut short before it reached sqlqueue holds it), and a cut anywhere."""
    secrets = draw(st.lists(SECRETS, min_size=1, max_size=3))
    pieces = []
    for secret in secrets:
        part = draw(st.integers(1, len(secret) - 1))
        pieces += [
            draw(st.text(SECRET_CHARS, max_size=12)),
            draw(st.sampled_from([secret, secret[:part], secret[part:]])),
        ]
    pieces.append(draw(st.text(SECRET_CHARS, max_size=12)))
    text = "".join(pieces)
    limit = draw(st.integers(0, len(text) + 2))
    keep = draw(st.sampled_from(["head", "tail"]))
    return secrets, text, limit, keep


@given(cut_cases())
def test_property_a_cut_never_keeps_a_run_of_a_secret(
    case: tuple[list[str], str, int, str],
) -> None:
    secrets, text, limit, keep = case
    redactor = Redactor.of(secrets)
    # The text between the secrets may be a run of one by chance, and a part of a secret is
    # no secret where the text goes on past it: only what the text holds once its secrets are
    # replaced (at no cut) may be in the cut text ...
    whole = storable(redactor.text(text))
    cut = clip(text, limit, redactor=redactor, keep=keep)  # type: ignore[arg-type]
    assert len(cut) <= max(limit, 0)
    assert set(leaks(secrets, [cut])) <= set(leaks(secrets, [whole]))
    if len(whole) <= limit:
        assert cut == whole
        return
    # ... and at the cut itself, no part of a secret is left: not its start at the end of a
    # head, nor its end at the start of a tail.
    for needle in redactor.needles:
        for size in range(1, len(needle)):
            if keep == "head":
                assert not cut.endswith(needle[:size]), (needle, cut)
            else:
                assert not cut.startswith(needle[-size:]), (needle, cut)


def test_a_partial_secret_at_either_cut_is_redacted() -> None:
    redactor = Redactor.of(["tok_abcdef123"])
    assert clip("hello tok_abcdef123", 12, redactor=redactor) == "hello ***"
    assert clip("hello tok_abc and on", 12, redactor=redactor) == "hello ***"
    assert clip("tok_abcdef123 ok", 8, redactor=redactor, keep="tail") == "*** ok"
    assert clip("on and def123 ok", 9, redactor=redactor, keep="tail") == "*** ok"
    two = Redactor.of(["AAAAAAXXXXXX", "XXXXXXBBBBBBB"])
    assert clip("AAAAAAXXXXXXBBBBBBB", 100, redactor=two) == "***"


# -- a real worker -------------------------------------------------------------------------------


@st.composite
def jobs_cases(draw: st.DrawFn) -> dict[str, Any]:
    token = draw(SECRETS)
    # A second secret overlapping the first's end, as the text holds them: "...tok|en+more".
    overlap = draw(st.integers(1, len(token) - 1))
    other = token[overlap:] + draw(st.text(SECRET_CHARS, min_size=WINDOW, max_size=12))
    assume(other != token)
    secrets = [token, other]
    before = surrounding(draw, secrets, draw(OFFSETS))
    after = surrounding(draw, secrets, draw(st.integers(0, 40)))
    return {"token": token, "other": other, "overlap": overlap, "before": before, "after": after}


MODES = ("error", "retry", "permanent", "too_large", "not_json", "result")


def test_property_no_run_of_a_secret_is_stored_or_logged(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = backend.queue(
        encryption_keys=[Fernet.generate_key().decode()], tracer_provider=provider
    )

    @queue.task("leaky", secret_fields=["token", "other"], max_attempts=1)
    def leaky(
        token: str, other: str, overlap: int, before: str, after: str, mode: str
    ) -> dict[str, str]:
        text = before + token + other[len(token) - overlap :] + after
        if mode == "error":
            raise ValueError(text)
        if mode == "retry":
            raise sqlqueue.Retry(reason=text, details={"body": text, text: 1})
        if mode == "permanent":
            raise sqlqueue.PermanentError(text, details={"body": text, "token": token})
        if mode == "too_large":
            raise sqlqueue.PermanentError("big", details={"body": text + "x" * 8_100})
        if mode == "not_json":
            raise sqlqueue.PermanentError("odd", details={"body": text, "object": object()})
        return {"echo": text, "token": token}

    caplog.set_level(logging.DEBUG)

    def texts_of(case: dict[str, Any]) -> tuple[list[str], list[str]]:
        """What the jobs of ``case`` left in the database and in the log."""
        caplog.clear()
        exporter.clear()
        with backend.engine.begin() as conn:
            ids = [leaky.enqueue(conn, mode=mode, **case) for mode in MODES]
        drain(queue)
        with backend.engine.connect() as conn:
            rows = conn.execute(
                sa.select(*(sa.cast(column, sa.Text) for column in jobs.c)).where(
                    jobs.c.id.in_(ids)
                )
            ).all()
        stored = [str(value) for row in rows for value in row if value is not None]
        for job_id in ids:
            job = queue.get_job(job_id)
            assert job is not None
            assert job.status in ("dead", "succeeded")
            stored.append(json.dumps([job.last_error, job.result], ensure_ascii=False))
            stored += [record.error for record in job.errors]
            stored += [json.dumps(record.details, ensure_ascii=False) for record in job.errors]
            stored += [
                str(value) for record in job.errors for value in (record.details or {}).values()
            ]
        logged = [caplog.text] + [str(record.__dict__) for record in caplog.records]
        assert len(exporter.get_finished_spans()) >= len(MODES)  # one per attempt at least
        for span in exporter.get_finished_spans():  # the spans: attributes, events, status
            logged += [str(dict(span.attributes or {})), str(span.status.description)]
            logged += [str(dict(event.attributes or {})) for event in span.events]
        return stored, logged

    # The framing every job's texts share (logger names, paths, the handler's source lines):
    # a window of a secret found there is the framing's, not a leak. Hypothesis draws words
    # from the code's own literals, so it does try secrets such as "sqlqueue".
    snowmen = {
        "token": "\u2603" * 8,
        "other": "\u2603" * 9,
        "overlap": 4,
        "before": "",
        "after": "",
    }
    control_stored, control_logged = texts_of(snowmen)
    control = " ".join(control_stored + control_logged)

    @given(jobs_cases())
    def check(case: dict[str, Any]) -> None:
        stored, logged = texts_of(case)
        secrets = [case["token"], case["other"]]
        framing = {window for secret in secrets for window in windows(secret) if window in control}
        assert set(leaks(secrets, stored)) <= framing
        assert set(leaks(secrets, logged)) <= framing

    check()


# -- secrets in keys, bytes, tuples and exception args: every view ------------------------------
#
# Issue 44, item 1: a handler puts its secrets where a walk over string values alone misses
# them — a mapping's keys (text, bytes, a tuple, the secret number itself), bytes, tuples,
# sets, an exception's args, nested — in its ``Retry`` and ``PermanentError`` details, its
# result and the args of the error it raises. No 8-character slice of a secret (as it is, or as
# ``repr``, ``ascii``, JSON or a ``bytes`` ``repr`` writes it) may reach the job's row, a log
# record, a span, ``sqlqueue jobs show --json`` or the web page's job page.

SLICE = 8
#: A secret number's digits: 2 and 4 only, so that no timestamp, id or duration in a record
#: holds a run of eight of them by chance.
SECRET_DIGITS = st.text(st.sampled_from("24"), min_size=16, max_size=16)
TEXT_SECRETS = st.text(SECRET_CHARS, min_size=SLICE, max_size=24)
#: A secret's surroundings in a text: none of the secrets' characters, so no slice is made.
AROUND = st.text(st.sampled_from("x ./:-=_"), max_size=4)
SECRET_NAMES = st.sampled_from(["token", "card", "pin"])


def slices(secret: str) -> set[str]:
    """Every :data:`SLICE` characters of ``secret``, in each form a stored text can quote
    them in."""
    runs = {secret[i : i + SLICE] for i in range(len(secret) - SLICE + 1)}
    return {
        form
        for run in runs
        for form in (
            run,
            repr(run)[1:-1],
            ascii(run)[1:-1],
            repr(run.encode("utf-8"))[2:-1],
            json.dumps(run, ensure_ascii=False)[1:-1],
            json.dumps(run)[1:-1],
        )
    }


def sliced(secrets: list[str], texts: list[str]) -> set[str]:
    return {
        piece for secret in secrets for piece in slices(secret) if any(piece in t for t in texts)
    }


# A shape is a JSON recipe the handler builds its value from, with the plaintext secrets it
# was given: a payload must be JSON, the value built from it need not be.
SECRET_LEAF = st.tuples(st.just("secret"), SECRET_NAMES)
TEXT_LEAF = st.tuples(st.just("text"), AROUND, SECRET_NAMES, AROUND)
BYTES_LEAF = st.tuples(st.just("bytes"), TEXT_LEAF)
PLAIN_LEAF = st.tuples(st.just("plain"), st.sampled_from(["k", "v", ""]))
KEY_SHAPES = st.recursive(
    st.one_of(SECRET_LEAF, TEXT_LEAF, BYTES_LEAF, PLAIN_LEAF),
    lambda inner: st.tuples(st.sampled_from(["tuple", "frozenset"]), st.lists(inner, max_size=3)),
    max_leaves=4,
)
VALUE_SHAPES = st.recursive(
    st.one_of(SECRET_LEAF, TEXT_LEAF, BYTES_LEAF, PLAIN_LEAF),
    lambda inner: st.one_of(
        st.tuples(st.just("dict"), st.lists(st.tuples(KEY_SHAPES, inner), max_size=3)),
        st.tuples(st.sampled_from(["list", "tuple"]), st.lists(inner, max_size=3)),
        st.tuples(
            st.just("error"),
            st.sampled_from(["ValueError", "KeyError", "RuntimeError"]),
            st.lists(inner, max_size=3),
        ),
    ),
    max_leaves=10,
)
DETAILS_SHAPES = st.tuples(
    st.just("dict"), st.lists(st.tuples(KEY_SHAPES, VALUE_SHAPES), max_size=4)
)
ARGS_SHAPES = st.tuples(st.just("tuple"), st.lists(VALUE_SHAPES, min_size=1, max_size=3))
ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "KeyError": KeyError,
    "RuntimeError": RuntimeError,
}


def build(shape: Any, secrets: dict[str, Any]) -> Any:
    """The value ``shape`` describes, holding the plaintext ``secrets`` where it says."""
    kind = shape[0]
    if kind == "secret":
        return secrets[shape[1]]
    if kind == "text":
        return f"{shape[1]}{secrets[shape[2]]}{shape[3]}"
    if kind == "bytes":
        return build(shape[1], secrets).encode("utf-8")
    if kind == "plain":
        return shape[1]
    if kind == "dict":
        return {build(key, secrets): build(value, secrets) for key, value in shape[1]}
    if kind == "error":
        return ERRORS[shape[1]](*(build(arg, secrets) for arg in shape[2]))
    items = [build(item, secrets) for item in shape[1]]
    return {"list": list, "tuple": tuple, "frozenset": frozenset}[kind](items)


#: What each job of a case does with its shapes.
SHAPE_MODES = ("retry", "permanent", "result", "raise")


@st.composite
def shapes_cases(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "token": draw(TEXT_SECRETS),
        "card": {"number": draw(SECRET_DIGITS)},
        "pin": int(draw(SECRET_DIGITS)),
        "details": draw(DETAILS_SHAPES),
        "result": draw(VALUE_SHAPES),
        "args": draw(ARGS_SHAPES),
        # The job whose ``sqlqueue jobs show --json`` is read (the issue's case reads all four).
        "shown": draw(st.sampled_from(SHAPE_MODES)),
    }


@pytest.mark.property
@given(shapes_cases())
def test_property_a_redacted_value_holds_no_slice_of_a_secret_in_any_key_or_value(
    case: dict[str, Any],
) -> None:
    secrets = {"token": case["token"], "card": case["card"]["number"], "pin": case["pin"]}
    redactor = Redactor.of(secrets.values())
    texts = []
    for shape in (case["details"], case["result"], case["args"]):
        value = redactor.value(build(shape, secrets))
        texts += [repr(value), str(value)]
        if isinstance(value, dict):
            texts += [str(key) for key in value]
    assert not sliced([case["token"], case["card"]["number"], str(case["pin"])], texts)


def strings_in(value: Any) -> list[str]:
    """Every text of a JSON value, keys too, as it reads once decoded (a JSON text escapes a
    backslash that a ``bytes`` ``repr`` would show)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(text for item in value.values() for text in strings_in(item))]
    if isinstance(value, list):
        return [text for item in value for text in strings_in(item)]
    return [str(value)]


#: The issue's own example, as shapes: a card number and a token (in a tuple) as keys, bytes
#: and the secret number too, in a ``Retry``'s details (JSON once its keys are text, so stored
#: as such); the same in a result, and with an exception among the args of a raised error.
ISSUE_DETAILS = (
    "dict",
    [
        (("secret", "card"), ("plain", "declined")),
        (("tuple", [("secret", "token")]), ("plain", "bad")),
        (("bytes", ("text", "", "token", "")), ("plain", "v")),
        (("secret", "pin"), ("plain", "k")),
    ],
)
ISSUE_ARGS = (
    "tuple",
    [
        ISSUE_DETAILS,
        ("secret", "pin"),
        ("bytes", ("text", "", "token", "")),
        ("error", "ValueError", [("bytes", ("text", "", "card", ""))]),
    ],
)
#: Log record attributes that are the logging machinery's numbers (times, thread and process
#: ids): never the job's, and digits that a secret's could match by chance.
LOG_NOISE = {"created", "msecs", "relativeCreated", "thread", "process", "lineno"}


@pytest.mark.property
def test_property_no_secret_in_a_key_bytes_tuple_or_exception_arg_reaches_any_view(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = backend.queue(
        encryption_keys=[Fernet.generate_key().decode()], tracer_provider=provider
    )
    web = browser_client(create_app(queue))

    @queue.task("shapes", secret_fields=["token", "card.number", "pin"], max_attempts=1)
    def shapes(token: str, card: dict[str, str], pin: int, shaped: str, mode: str) -> Any:
        secrets = {"token": token, "card": card["number"], "pin": pin}
        recipes = json.loads(shaped)  # as text: a recipe may nest deeper than a payload may
        if mode == "retry":
            raise sqlqueue.Retry(reason="again", details=build(recipes["details"], secrets))
        if mode == "permanent":
            raise sqlqueue.PermanentError("refused", details=build(recipes["details"], secrets))
        if mode == "raise":
            raise ValueError(*build(recipes["args"], secrets))
        return build(recipes["result"], secrets)

    caplog.set_level(logging.DEBUG)

    def views_of(case: dict[str, Any]) -> list[str]:
        """Everything of the jobs of ``case``: stored, logged, traced and shown."""
        caplog.clear()
        exporter.clear()
        with backend.engine.begin() as conn:
            shaped = json.dumps({name: case[name] for name in ("details", "result", "args")})
            ids = [
                shapes.enqueue(
                    conn,
                    token=case["token"],
                    card=case["card"],
                    pin=case["pin"],
                    shaped=shaped,
                    mode=mode,
                )
                for mode in SHAPE_MODES
            ]
        drain(queue)
        with backend.engine.connect() as conn:
            rows = conn.execute(
                sa.select(*(sa.cast(column, sa.Text) for column in jobs.c)).where(
                    jobs.c.id.in_(ids)
                )
            ).all()
        texts = [str(value) for row in rows for value in row if value is not None]
        for mode, job_id in zip(SHAPE_MODES, ids, strict=True):
            job = queue.get_job(job_id)
            assert job is not None
            assert job.status in ("dead", "succeeded"), job
            texts += strings_in(job.to_dict())  # the stored JSON's texts, unescaped
            if case.get("shown", mode) == mode:  # a process each: one job a generated case
                shown = run_cli("jobs", "show", str(job_id), "--json", url=backend.url)
                assert shown.returncode == 0, shown.stderr
                texts += [shown.stdout, shown.stderr, *strings_in(json.loads(shown.stdout))]
            page = web.get(f"/jobs/{job_id}")
            assert page.status_code == 200
            texts.append(html.unescape(page.text))
        texts.append(caplog.text)
        texts += [
            str({name: value for name, value in vars(record).items() if name not in LOG_NOISE})
            for record in caplog.records
        ]
        for span in exporter.get_finished_spans():
            texts += [str(dict(span.attributes or {})), str(span.status.description)]
            texts += [str(dict(event.attributes or {})) for event in span.events]
        return texts

    # The framing every case's views share (the page's markup and script, the CLI's field
    # names, the handler's source in a traceback): a slice found there is not a leak.
    control_case = {
        "token": "\u2603" * SLICE,
        "card": {"number": "\u2604" * 16},
        "pin": 7,
        "details": ISSUE_DETAILS,
        "result": ISSUE_DETAILS,
        "args": ISSUE_ARGS,
    }
    control = " ".join(views_of(control_case))

    @given(shapes_cases())
    @example(
        {
            "token": "tok_live_4eC39HqLyjWDarjtT1zdp7dc",
            "card": {"number": "4242424242424242"},
            "pin": 4224422442244224,
            "details": ISSUE_DETAILS,
            "result": ISSUE_DETAILS,
            "args": ISSUE_ARGS,
        }
    )
    def check(case: dict[str, Any]) -> None:
        secrets = [case["token"], case["card"]["number"], str(case["pin"])]
        framing = {piece for secret in secrets for piece in slices(secret) if piece in control}
        assert sliced(secrets, views_of(case)) <= framing

    check()
