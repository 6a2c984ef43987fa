"""Numbers from outside are ASCII digits, read by one parser (``sqlqueue/_digits.py``): the web
page answers 400 naming the parameter, the CLI exits 2 with one line, and a webhook
receiver's ``Retry-After`` that is not one falls back to the backoff.

``str.isdigit()`` said yes to ``"²"``, which ``int()`` then refused: an HTTP 500 on the web page
for ``?before_id=²``, a traceback from ``sqlqueue limit q ²``, a raw ``ValueError`` failing a
webhook attempt. And it read ``"٣"`` (an Arabic-Indic three) as 3.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sqlqueue._digits import ascii_number
from sqlqueue.web import create_app
from sqlqueue.webhooks._policy import retry_after_seconds
from tests._support import run_cli
from tests._support.web import browser_client, populated, token_of
from tests.conftest import Backend

#: Digits ``str.isdigit()`` accepts: superscripts, Arabic-Indic, full-width and mathematical.
NOT_ASCII = ["²", "٣", "\uff11\uff12", "1²", "¹", "\U0001d7d7"]


@given(st.text(max_size=25))
@example("²")
@example("٣")
@example("0")
@example("9" * 19)
@example("9" * 20)
@example(" 1")
@example("+1")
def test_a_number_is_ascii_digits_and_nothing_else(text: str) -> None:
    number = ascii_number(text)
    if number is None:
        assert not (0 < len(text) <= 19 and all(c in "0123456789" for c in text))
    else:
        assert str(number) == text.lstrip("0") or (number == 0 and set(text) == {"0"})
        assert all(c in "0123456789" for c in text)


@pytest.fixture
def web(backend: Backend) -> Any:
    queue, _ids = populated(backend)
    return browser_client(create_app(queue))


@pytest.mark.backend_independent("the web page's parsing of its parameters, before any read")
@pytest.mark.parametrize("digits", NOT_ASCII)
def test_the_web_page_answers_400_naming_the_parameter(web: Any, digits: str) -> None:
    client = web
    token = token_of(client.get("/jobs").text)
    answers = {
        "before_id": client.get("/jobs", params={"before_id": digits}),
        "start": client.get("/workflows/1", params={"start": digits}),
        "limit": client.post(
            "/queues/limit", data={"csrf_token": token, "queue": "mail", "limit": digits}
        ),
        "job_id": client.post(
            "/jobs/bulk",
            data={"csrf_token": token, "action": "cancel", "scope": "selected", "job_id": digits},
        ),
    }
    for name, answer in answers.items():
        assert answer.status_code == 400, (name, answer.status_code, answer.text[:200])
        assert name.replace("_", " ") in answer.text or name in answer.text, (name, answer.text)


@pytest.mark.backend_independent("the CLI's parsing of its argument, before any write")
@pytest.mark.parametrize("digits", ["²", "٣"])
def test_the_cli_exits_2_in_one_line(backend: Backend, digits: str) -> None:
    done = run_cli("limit", "mail", digits, url=backend.url)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "limit must be a whole number" in done.stderr


@pytest.mark.parametrize("digits", NOT_ASCII)
def test_a_retry_after_that_is_not_ascii_digits_leaves_the_backoff(digits: str) -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert retry_after_seconds(digits, now=now, cap=3600) is None
    assert retry_after_seconds("120", now=now, cap=3600) == 120
