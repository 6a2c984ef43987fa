"""A receiver parses exactly the addresses sqlqueue checked: display names and subjects, judged
by what arrives at a real SMTP server (aiosmtpd), parsed with the standard library's strict
policy.

Python's email package used to write ``=?utf-8?q?eve=40evil.example=2C?= <ada@example.com>``
out as ``To: eve@evil.example, <ada@example.com>`` (a second recipient for the reader and for
Reply-All), a 2,000-character display name as one 2,001-byte line (RFC 5322 allows 998: the
server refused it, and the job died), and a subject's control characters raw. Now an encoded
word hiding address syntax, a group, and control characters (as given or decoded) are refused
at enqueue; everything else is parsed and written again from its parsed parts
(``sqlqueue/email/_fold.py``), and must arrive as exactly what was checked: the same
addresses, every line within 998 bytes, no control character in the headers.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.header import decode_header, make_header
from email.headerregistry import Address
from email.message import EmailMessage

import pytest
import sqlalchemy as sa
from hypothesis import example, given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue.email import SMTP, Content, InvalidAddress, UnsafeHeader
from sqlqueue.email._headers import CONTROLS, flatten, header_problem
from sqlqueue.email._message import (
    OutgoingMessage,
    build_message,
    check_address,
    parse_address,
)
from sqlqueue.email._smtp import deliver
from tests._support import count_jobs
from tests.conftest import Backend
from tests.smtp_server import Received, SMTPServer
from tests.test_email import SENDER, job_of, new_mailer, run_until_final, send
from tests.test_email import queues as queues

#: The subject is what reaches the SMTP server; refusals happen before any SQL.
pytestmark = [pytest.mark.timeout(120), pytest.mark.backend_independent("email headers")]

ADA = "ada@example.com"


def q_word(text: str) -> str:
    """``text`` as one RFC 2047 Q-encoded word (every byte but letters and digits escaped)."""
    encoded = "".join(
        chr(byte) if chr(byte).isascii() and chr(byte).isalnum() else f"={byte:02X}"
        for byte in text.encode("utf-8", "surrogatepass")
    )
    return f"=?utf-8?q?{encoded}?="


def b_word(text: str) -> str:
    """``text`` as one RFC 2047 B-encoded word."""
    data = text.encode("utf-8", "surrogatepass")
    return f"=?utf-8?b?{base64.b64encode(data).decode()}?="


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- what arrives --------------------------------------------------------------------------------


def strictly_parsed(raw: bytes) -> EmailMessage:
    """``raw`` parsed under ``policy.strict`` (a structural defect raises), after checking the
    bytes themselves: every line at most 998 bytes, no control byte in the header block but the
    CR LF that ends a line; and no header with a defect."""
    lines = raw.split(b"\r\n")
    assert max(len(line) for line in lines) <= 998, max(len(line) for line in lines)
    head = raw.split(b"\r\n\r\n", 1)[0].replace(b"\r\n", b"")
    controls = set(head.decode("utf-8", "replace")) & CONTROLS
    assert not controls, (controls, head[:300])
    message = message_from_bytes(raw, policy=policy.strict)
    assert isinstance(message, EmailMessage)
    for name in message:
        assert message[name].defects == (), (name, message[name].defects)
    return message


def arrived_addresses(received: Received, name: str) -> list[Address]:
    """The addresses of header ``name`` as a receiver parses them, each display name as an RFC
    2047 reader joins its encoded words (without the space between two of them, RFC 2047 6.2):
    Python's own parser puts one there, which only changes the spacing, so it is held to the
    same text but for spaces."""
    message = strictly_parsed(received.raw)
    header = message[name]
    assert all(group.display_name is None for group in header.groups), header.groups
    parsed = list(header.addresses)
    value = _raw_header(received.raw, name)
    found = []
    for address, text in zip(parsed, _split_top_level(value), strict=True):
        display = address.display_name
        phrase = text.rpartition("<")[0].strip()
        if phrase.startswith("=?"):  # encoded words: read as RFC 2047 says
            rfc = str(make_header(decode_header(phrase)))
            assert display.replace(" ", "") == rfc.replace(" ", ""), (display, rfc)
            display = rfc
        found.append(Address(display_name=display, addr_spec=address.addr_spec))
    return found


def _raw_header(raw: bytes, name: str) -> str:
    """Header ``name``'s value as sent, unfolded."""
    head = raw.split(b"\r\n\r\n", 1)[0].decode("utf-8")
    unfolded = head.replace("\r\n ", " ").replace("\r\n\t", "\t")
    for line in unfolded.split("\r\n"):
        field, _, value = line.partition(":")
        if field.lower() == name.lower():
            return value.strip()
    raise AssertionError(f"no {name} header in {head!r}")


def _split_top_level(value: str) -> list[str]:
    """An address list split at its commas outside quoted strings and angle brackets."""
    parts, current, quoted_, angle, escaped = [], "", False, False, False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\" and quoted_:
            escaped = True
        elif char == '"':
            quoted_ = not quoted_
        elif char == "<" and not quoted_:
            angle = True
        elif char == ">" and not quoted_:
            angle = False
        elif char == "," and not quoted_ and not angle:
            parts.append(current)
            current = ""
            continue
        current += char
    return [*parts, current]


def same(address: Address) -> tuple[str, str]:
    return (address.display_name, address.addr_spec)


# -- refused at enqueue --------------------------------------------------------------------------

#: The issue's forms: an encoded word (Q or B) whose text is address syntax, and groups.
SMUGGLED = [
    f"{q_word('eve@evil.example,')} <{ADA}>",
    f"{b_word('eve@evil.example,')} <{ADA}>",
    f"{q_word('eve@evil.example')} <{ADA}>",
    f"Team: {q_word('eve@evil.example,')} <{ADA}>;",
    f"{q_word('eve@evil.example,')}: {ADA};",
    f"Friends: {ADA};",
    f"{q_word(q_word('eve@evil.example,'))} <{ADA}>",  # a word inside a word
    f"{q_word('Ada ' + b_word('Eve'))} <{ADA}>",
]


@pytest.mark.parametrize("address", SMUGGLED)
def test_an_encoded_word_hiding_an_address_or_a_group_is_refused_at_enqueue(
    backend: Backend, queues: list[sqlqueue.Queue], address: str
) -> None:
    _, mailer = new_mailer(backend, queues, 25)
    with backend.engine.begin() as conn:
        with pytest.raises(InvalidAddress, match=r"to\[0\]: .*(address syntax|group|encoded)"):
            mailer.send(conn, to=[address], subject="Hi", text="body")
        conn.execute(sa.text("SELECT 1"))  # the caller's transaction is still usable
    assert count_jobs(backend.engine) == 0


CONTROL_SAMPLES = ["\x01", "\x07", "\x1b", "\t", "\x7f", "\x9b"]


@pytest.mark.parametrize("char", CONTROL_SAMPLES)
@pytest.mark.parametrize("where", ["subject", "display name"])
@pytest.mark.parametrize("encode", [str, q_word], ids=["raw", "encoded"])
def test_a_control_character_is_refused_at_enqueue(
    backend: Backend, queues: list[sqlqueue.Queue], char: str, where: str, encode: object
) -> None:
    _, mailer = new_mailer(backend, queues, 25)
    text = encode(f"Hi{char}there")  # type: ignore[operator]
    message = (
        {"to": ADA, "subject": text}
        if where == "subject"
        else {"to": f"{text} <{ADA}>", "subject": "Hi"}
    )
    with backend.engine.begin() as conn:
        with pytest.raises(sqlqueue.EnqueueError, match="control character"):
            mailer.send(conn, text="body", **message)
        conn.execute(sa.text("SELECT 1"))
    assert count_jobs(backend.engine) == 0


def test_an_address_longer_than_smtp_allows_is_refused_at_enqueue(
    backend: Backend, queues: list[sqlqueue.Queue]
) -> None:
    _, mailer = new_mailer(backend, queues, 25)
    longest = "a" * (254 - len("@example.com")) + "@example.com"
    with backend.engine.begin() as conn:
        with pytest.raises(InvalidAddress, match="SMTP allows 254"):
            mailer.send(conn, to="a" + longest, subject="Hi", text="body")
        mailer.send(conn, to=longest, subject="Hi", text="body")  # 254 bytes is fine
    assert count_jobs(backend.engine) == 1


# -- written from the parsed parts ---------------------------------------------------------------


@pytest.fixture
def smtp_server() -> Iterator[tuple[SMTPServer, int]]:
    smtp = SMTPServer()
    with smtp.running() as port:
        yield smtp, port


#: Display names that are accepted and must arrive as themselves.
NEUTRALISED = [
    "a" * 2000,  # one word of 2,000 characters: the 2,001-byte line
    "Ada " * 500,
    "é" * 700,
    "eve@evil.example, ",  # quoted by the app: address syntax as text, one address
    "Lovelace, Ada",
    'Ada "the Countess" \\ Lovelace',
]


@pytest.mark.parametrize("name", NEUTRALISED, ids=range(len(NEUTRALISED)))
def test_a_display_name_arrives_as_exactly_the_address_checked(
    backend: Backend,
    queues: list[sqlqueue.Queue],
    smtp_server: tuple[SMTPServer, int],
    name: str,
) -> None:
    """Through ``Mailer.send``, a worker and a real server: the job succeeds at its first
    attempt, and the To header parses (strictly) as the checked address and no other."""
    server, port = smtp_server
    queue, mailer = new_mailer(backend, queues, port)
    given_ = f"{quoted(name)} <{ADA}>"
    checked = parse_address(given_, "to[0]")
    assert checked.display_name == name
    subject = "Grüße, " + name[:300]
    job_id = send(backend, mailer, to=[given_, "bob@example.com"], subject=subject, text="b")
    job = run_until_final(queue, job_id)
    assert (job.status, job.attempts) == ("succeeded", 1), job.last_error
    [received] = server.received
    assert [same(a) for a in arrived_addresses(received, "To")] == [
        (name, ADA),
        ("", "bob@example.com"),
    ]
    assert [same(a) for a in arrived_addresses(received, "From")] == [
        same(parse_address(SENDER, "sender"))
    ]
    assert strictly_parsed(received.raw)["Subject"] == subject
    assert received.recipients == [ADA, "bob@example.com"]
    # what the job keeps is the checked address, and parses back as itself
    stored = job_of(queue, job_id).payload["to"][0]
    assert same(parse_address(stored, "to[0]")) == (name, ADA)


def test_a_stored_address_that_send_would_refuse_dies_at_once_and_sends_nothing(
    backend: Backend, queues: list[sqlqueue.Queue], smtp_server: tuple[SMTPServer, int]
) -> None:
    """A row written around ``Mailer.send`` (or before these checks) is parsed again by its
    attempt: the smuggled address is never written out, the job goes dead at its first try."""
    server, port = smtp_server
    queue, mailer = new_mailer(backend, queues, port)
    with backend.engine.begin() as conn:
        job_id = mailer.task.enqueue(
            conn,
            message_id="<1@example.com>",
            sender=SENDER,
            to=[SMUGGLED[0]],
            key="k1",
            content={"subject": "Hi", "text": "b", "html": None, "hash": "sha256:x"},
        )
    job = run_until_final(queue, job_id)
    assert (job.status, job.attempts) == ("dead", 1)
    assert job.errors[-1].kind == "UnsafeHeader"
    assert "address syntax" in (job.last_error or "")
    assert server.received == []
    assert server.data_commands == 0


# -- as a property, against the server -----------------------------------------------------------


class _Servers:
    """One SMTP server with SMTPUTF8 and one without, for the whole module's properties."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_utf8: dict[bool, tuple[SMTPServer, int]] = {}


@pytest.fixture(scope="module")
def servers() -> Iterator[_Servers]:
    found = _Servers()
    plain, utf8 = SMTPServer(), SMTPServer()
    with plain.running() as plain_port, utf8.running(enable_SMTPUTF8=True) as utf8_port:
        found.by_utf8 = {False: (plain, plain_port), True: (utf8, utf8_port)}
        yield found


def delivered(servers: _Servers, utf8: bool, message: OutgoingMessage, to: list[str]) -> Received:
    """``message`` sent by sqlqueue's own ``deliver`` to the server (with or without SMTPUTF8),
    as that server received it."""
    server, port = servers.by_utf8[utf8]
    smtp = SMTP(host="127.0.0.1", port=port, starttls=False, timeout=30)
    with servers.lock:
        before = len(server.received)
        asyncio.run(deliver(smtp, message, sender="noreply@example.com", recipients=to))
        assert len(server.received) == before + 1
        return server.received[-1]


HOSTILE_TEXT = st.sampled_from(
    [
        "eve@evil.example,",
        "eve@evil.example, <x@y.z>",
        "Team: eve@evil.example;",
        "a" * 2000,
        "x" * 80 + " " + "é" * 80,
        "\x1b[31mred",
        "=?utf-8?q?x?=",
        '"quoted" \\back',
        "  spaced   out  ",
        "\u202e\u0645\u0631\u062d\u0628\u0627",
        "=?utf-8?b?/w==?=",  # not UTF-8 once decoded
        "=?x-unknown?q?abc?=",
    ]
)
ANY_TEXT = (
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=80)
    | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=60, max_size=400)
    | HOSTILE_TEXT
)
FORMS = st.sampled_from(["raw", "quoted", "q", "b"])


def as_typed(name: str, form: str) -> str:
    """``name`` as an app (or an attacker) would type it in a ``to=``."""
    shown = {"raw": name, "quoted": quoted(name), "q": q_word(name), "b": b_word(name)}[form]
    return f"{shown} <{ADA}>"


@pytest.mark.property
@given(name=ANY_TEXT, form=FORMS, utf8=st.booleans())
@example(name="eve@evil.example,", form="q", utf8=False)
@example(name="eve@evil.example,", form="b", utf8=True)
@example(name="a" * 2000, form="quoted", utf8=False)
@example(name="eve@evil.example, ", form="quoted", utf8=False)
def test_property_a_display_name_is_refused_at_enqueue_or_arrives_as_checked(
    servers: _Servers, name: str, form: str, utf8: bool
) -> None:
    typed = as_typed(name, form)
    try:
        checked = parse_address(typed, "to[0]")
    except InvalidAddress:
        return  # refused at enqueue, saying which field (the tests above say why)
    stored = check_address(typed, "to[0]")
    assert same(parse_address(stored, "to[0]")) == same(checked)  # the row's text reads back
    message = build_message(
        sender=SENDER,
        to=[stored],
        message_id="<1@example.com>",
        content=Content(subject="Hi", text="body"),
        date=datetime(2026, 1, 1, tzinfo=UTC),
    )
    received = delivered(servers, utf8, message, [ADA])
    assert [same(address) for address in arrived_addresses(received, "To")] == [same(checked)]
    assert received.recipients == [ADA]


@pytest.mark.property
@given(subject=ANY_TEXT | st.builds(lambda t, f: f(t), ANY_TEXT, st.sampled_from([q_word, b_word])))
@example(subject="Hi\x01there")
@example(subject="x" * 2000)
def test_property_a_subject_is_refused_at_enqueue_or_arrives_as_checked(
    servers: _Servers, subject: str
) -> None:
    try:
        content = Content(subject=subject, text="body")
    except sqlqueue.ConfigurationError:
        assert not subject.strip() or header_problem(subject) is not None
        return
    checked = str(policy.default.header_factory("Subject", subject))  # what the parser reads
    message = build_message(
        sender=SENDER,
        to=[ADA],
        message_id="<1@example.com>",
        content=content,
        date=datetime(2026, 1, 1, tzinfo=UTC),
    )
    received = delivered(servers, False, message, [ADA])
    assert strictly_parsed(received.raw)["Subject"] == checked


@pytest.mark.parametrize(
    ("value", "why"),
    [("x" * 990, "is 999 bytes long"), ("Hi\x1bthere", "control characters")],
)
def test_the_bytes_sent_are_refused_with_a_line_over_998_bytes_or_a_control_character(
    value: str, why: str
) -> None:
    """The last check, on the generated bytes, whatever wrote the header (here a raw value
    past every earlier check): no line over 998 bytes, no control character."""
    message = EmailMessage()
    message["From"] = "noreply@example.com"
    message.set_raw("Subject", value)
    message.set_content("body")
    with pytest.raises(UnsafeHeader, match=why):
        flatten(message, utf8=False, eight_bit=True)
