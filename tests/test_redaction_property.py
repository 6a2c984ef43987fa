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
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from hypothesis import assume, given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue._scrub import clip, storable
from sqlqueue._secrets import Redactor
from tests._support import drain
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
