"""Property tests of the web page's checks against arbitrary headers, cookies and tokens
(Hypothesis): each check answers — allowed or refused — and never raises (a crash would be a
500, and a check that can crash is a check an attacker can aim at), and nothing a request can
make up without the server's key passes. No database: these are the functions every request
runs before the page reads anything; ``tests/test_web_security.py`` drives them over HTTP.
"""

from __future__ import annotations

import re
import time

from hypothesis import example, given
from hypothesis import strategies as st
from starlette.requests import Request

from sqlqueue.web import _csrf
from sqlqueue.web._hosts import AllowedHosts, parse_host

KEY = b"k" * 32
NONCE = "n" * 43
#: What an HTTP header can hold as Starlette decodes it (latin-1), control characters and all.
header = st.text(st.characters(max_codepoint=255, exclude_categories=["Cs"]), max_size=80)
#: Text that looks a little like a host, so that parsing gets past its first character.
hostish = st.from_regex(r"\[?[a-zA-Z0-9.:\-\[\]_@%/ ]{0,30}(:[0-9]{0,6})?", fullmatch=True)


def request(headers: dict[str, str], *, cookie: str | None = None) -> Request:
    """A real Starlette request for a POST to the page at http://localhost:8080."""
    raw = [(name.lower().encode(), value.encode("latin-1")) for name, value in headers.items()]
    if cookie is not None:
        raw.append((b"cookie", f"{_csrf.COOKIE}={cookie}".encode("latin-1")))
    scope = {"type": "http", "method": "POST", "scheme": "http", "path": "/jobs/1/requeue",
             "root_path": "", "query_string": b"", "headers": raw,
             "server": ("127.0.0.1", 8080)}  # fmt: skip
    return Request(scope)


@given(st.one_of(header, hostish))
@example("[::1]:8080")
@example("[::1")
@example("localhost:0")
@example("localhost:65536")
@example("LOCALHOST.:8080")
@example("localhost:\uff18\uff10\uff18\uff10")  # fullwidth digits
def test_a_host_header_is_parsed_or_refused_and_never_crashes(text: str) -> None:
    parsed = parse_host(text)
    allowed = AllowedHosts.of(None).allows(text, "http")

    if parsed is not None:
        assert parse_host(str(parsed)) == parsed  # what was understood reads back the same
        assert parsed.port is None or 0 < parsed.port < 65536
    if allowed:
        assert parsed is not None
        assert parsed.name in ("localhost", "127.0.0.1", "::1")


@given(
    origin=st.one_of(header, hostish.map(lambda host: f"http://{host}")), use_referer=st.booleans()
)
@example(origin="http://localhost:8080@evil.example", use_referer=False)
@example(origin="http://evil.example#@localhost:8080", use_referer=True)
@example(origin="http://[::1", use_referer=False)
@example(origin="null", use_referer=False)
def test_an_origin_that_does_not_name_the_page_is_refused(origin: str, use_referer: bool) -> None:
    sent = {"Referer" if use_referer else "Origin": origin}

    problem = _csrf.origin_problem(request({"Host": "localhost:8080", **sent}))

    if problem is None:  # only the page's own scheme, name and port pass (a Referer: any path)
        rest = "([/?#].*)?" if use_referer else ""
        assert re.fullmatch(rf"http://localhost\.?:0*8080{rest}", origin.lower(), re.DOTALL)


@given(cookie=header, token=header)
@example(cookie=NONCE, token=NONCE)  # the old double submit
@example(cookie=NONCE, token=f"{int(time.time())}.{NONCE}")
def test_no_cookie_and_token_made_up_without_the_key_pass(cookie: str, token: str) -> None:
    problem = _csrf.token_problem(
        request({"Host": "localhost:8080"}, cookie=cookie), {_csrf.FIELD: token}, KEY, time.time()
    )

    assert problem is not None


@given(
    age=st.integers(min_value=0, max_value=_csrf.TOKEN_LIFETIME - 1),
    position=st.integers(min_value=0, max_value=42),
    replacement=st.sampled_from("AQgw-_09"),
)
def test_a_signed_token_passes_in_its_lifetime_and_no_one_character_change_does(
    age: int, position: int, replacement: str
) -> None:
    now = time.time()
    issued = int(now) - age
    signature = _csrf.signature(KEY, NONCE, issued, "")
    changed = signature[:position] + replacement + signature[position + 1 :]
    page = request({"Host": "localhost:8080"}, cookie=NONCE)

    def problem(token: str) -> str | None:
        return _csrf.token_problem(page, {_csrf.FIELD: token}, KEY, now)

    assert problem(f"{issued}.{signature}") is None
    if changed != signature:
        assert problem(f"{issued}.{changed}") is not None
    assert problem(f"{issued - 1}.{signature}") is not None
    assert problem(f"{issued - _csrf.TOKEN_LIFETIME - 1}.{signature}") is not None
