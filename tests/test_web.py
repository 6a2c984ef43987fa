"""The web page over HTTP on every backend: what each page shows, the dead-letter actions, and
the safety matrix — CSRF, nothing changes on GET, ``authorize``, ``read_only``, escaping.

The app runs in Starlette's TestClient (the ASGI app itself, no mock) against the backend's
real database; the browser tests (``test_web_browser.py``) serve it with uvicorn.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount

with warnings.catch_warnings():  # Starlette would rather have httpx2; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import sqlqueue
import sqlqueue.web
from sqlqueue.testing import age_jobs
from sqlqueue.web import create_app
from sqlqueue.web._chart import chart_of
from tests._support import drain, enqueue
from tests._support.source import parse
from tests._support.web import KEY, browser_client, make_queue, populated, token_of, web_command
from tests.conftest import Backend


def client(queue: sqlqueue.Queue, **options: Any) -> TestClient:
    return browser_client(create_app(queue, **options))


def dead_snapshot(engine: sa.Engine) -> list[tuple[Any, ...]]:
    """Every job's state and dead-letter marks: what no refused request may change."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT id, status, requeued_as, requeued_by, discarded_at, discarded_by "
                "FROM sqlqueue_jobs ORDER BY id"
            )
        )
        paused = conn.execute(
            sa.text("SELECT name, paused_at, max_running FROM sqlqueue_queues")
        ).all()
        return [tuple(row) for row in rows] + [tuple(row) for row in paused]


def test_the_web_package_names_exactly_its_public_api() -> None:
    assert set(sqlqueue.web.__all__) == {"Authorize", "CurrentUser", "create_app"}


def test_create_app_refuses_what_is_not_a_queue_or_a_function(tmp_path) -> None:
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'unopened.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match=r"expected a sqlqueue\.Queue"):
        create_app("sqlite://")  # type: ignore[arg-type]
    with pytest.raises(sqlqueue.ConfigurationError, match="authorize: expected a function"):
        create_app(queue, authorize="admins")  # type: ignore[arg-type]
    with pytest.raises(sqlqueue.ConfigurationError, match="max_queued_age must be >= 0"):
        create_app(queue, max_queued_age=-1)

    async def allow(request: Request, action: str) -> bool:
        return False

    async def who(request: Request) -> str:
        return "ada"

    with pytest.raises(sqlqueue.ConfigurationError, match=r"authorize: expected a plain function"):
        create_app(queue, authorize=allow)  # type: ignore[arg-type]
    with pytest.raises(sqlqueue.ConfigurationError, match=r"current_user: expected a plain"):
        create_app(queue, current_user=who)  # type: ignore[arg-type]


def test_an_authorize_that_answers_neither_true_nor_false_allows_nothing(
    backend: Backend,
) -> None:
    queue, ids = populated(backend)
    # A truthy non-answer (here a string; a coroutine would be one too) must not pass for yes.
    web = browser_client(
        create_app(queue, authorize=lambda request, action: "no"),  # type: ignore[arg-type,return-value]
        raise_server_exceptions=False,
    )

    answer = web.get(f"/jobs/{ids['dead_503'][0]}")

    assert answer.status_code == 500
    assert "crm.sync" not in answer.text
    assert "503 from crm" not in answer.text


# -- the pages ----------------------------------------------------------------------------------


def test_overview_shows_the_unknown_type_alarm_in_one_line(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("billing.sync")(lambda: None)
    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "billing.sync")
    age_jobs(queue, [job_id], by=timedelta(hours=1))
    facts = {"host": "h", "pid": 1, "version": "0", "running": 0, "stopping": False}
    queue.admin.announce_worker(
        worker_id="an-older-release",
        facts={**facts, "queues": {"default": 1}, "job_types": ["mail.send"]},
        expires_in=60.0,
    )
    html = client(queue, max_queued_age=300).get("/").text
    (alarm,) = re.findall(r'<p class="alarm">(.*?)</p>', html, re.S)
    assert "<strong>unknown_type</strong>" in alarm
    assert "no live worker has a task for &#39;billing.sync&#39; (1 due job, oldest 36" in alarm


def test_overview_shows_counts_ages_recent_failures_top_errors_and_the_chart(
    backend: Backend,
) -> None:
    queue, ids = populated(backend)
    # One queued mail job has waited ten minutes.
    age_jobs(queue, ids["queued"][:1], by=timedelta(minutes=10))
    page = client(queue, max_queued_age=300).get("/")

    assert page.status_code == 200
    html = page.text
    assert 'data-count="dead">4<' in html
    assert 'data-count="succeeded">3<' in html
    assert 'data-count="dead_last_hour">4<' in html
    assert 'data-count="failed_last_hour">1<' in html
    assert '<tr data-queue="mail">' in html
    assert '<tr data-queue="hooks">' in html
    mail_row = html.split('<tr data-queue="mail">')[1].split("</tr>")[0]
    assert 'class="num late"' in mail_row  # waited 10 min, over the 5 min threshold
    assert "ConnectionError: 503 from crm" in html
    assert html.index("503 from crm") < html.index("410 Gone")  # the most frequent first
    assert "<svg" in html
    assert 'class="line succeeded"' in html
    assert 'data-total="succeeded">3<' in html
    assert "crm.sync" in html
    assert "mail.send" in html


def test_the_last_hour_tiles_link_to_lists_of_exactly_the_jobs_they_count(
    backend: Backend,
) -> None:
    queue, ids = populated(backend)
    queue.requeue(ids["dead_503"][0], by="ops", reason="handled: no longer counts")
    web = client(queue)
    overview = web.get("/").text

    def tile(name: str) -> tuple[int, set[int]]:
        link, figure = re.search(
            rf'<a class="tile[^"]*" href="([^"]+)">\s*<span class="label">[^<]*</span>\s*'
            rf'<span class="figure" data-count="{name}">(\d+)<',
            overview,
        ).groups()  # type: ignore[union-attr]
        html = web.get(link.replace("&amp;", "&")).text
        return int(figure), {int(part.split('"')[0]) for part in html.split('data-job-id="')[1:]}

    assert tile("dead_last_hour") == (3, {ids["dead_503"][1], *ids["dead_410"], *ids["charge"]})
    assert tile("failed_last_hour") == (1, set(ids["failed"]))
    assert web.get("/jobs?unhandled=yes").status_code == 400


def test_each_top_error_links_to_the_list_of_the_jobs_that_have_it(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue)
    overview = web.get("/").text
    top = overview.split('id="top-errors"')[1].split("</table>")[0]
    links = re.findall(r'<a href="([^"]+)">([^<]+)</a>', top)

    lists = {text: web.get(link.replace("&amp;", "&")) for link, text in links}

    assert [text for _, text in links][:2] == [
        "ConnectionError: 503 from crm",
        "ConnectionError: 410 Gone",
    ]
    assert all(page.status_code == 200 for page in lists.values())

    def listed(text: str) -> set[int]:
        html = lists[text].text
        return {int(part.split('"')[0]) for part in html.split('data-job-id="')[1:]}

    assert listed("ConnectionError: 503 from crm") == set(ids["dead_503"])
    assert listed("ConnectionError: 410 Gone") == set(ids["dead_410"])
    assert listed("TimeoutError: endpoint timed out") == set(ids["failed"])


def test_the_chart_alone_is_what_the_overview_refreshes(backend: Backend) -> None:
    queue, _ = populated(backend)
    web = client(queue, refresh_seconds=2)

    overview = web.get("/").text
    fragment = web.get("/chart")

    assert 'data-refresh-url="/chart" data-refresh-seconds="2' in overview
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith("<svg")
    assert 'data-total="failures">' in fragment.text


def test_job_list_filters_by_status_type_queue_error_and_since(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue)

    def listed(query: str) -> set[int]:
        page = web.get("/jobs" + query)
        assert page.status_code == 200, page.text
        return {int(part.split('"')[0]) for part in page.text.split('data-job-id="')[1:]}

    assert listed("?status=dead") == {*ids["dead_503"], *ids["dead_410"], *ids["charge"]}
    assert listed("?error=503") == set(ids["dead_503"])
    assert listed("?status=dead&type=crm.sync&error=Gone") == set(ids["dead_410"])
    assert listed("?queue=billing") == set(ids["charge"])
    assert listed("?status=failed&since=1h") == set(ids["failed"])
    assert listed("?since=2000-01-01T00:00:00Z&type=mail.send") == {*ids["ok"], *ids["queued"]}
    assert listed("?error=nothing+like+it") == set()


def test_job_list_pages_by_keyset_with_links_that_keep_the_filter(backend: Backend) -> None:
    queue = make_queue(backend)
    made = enqueue(queue, "mail.send", 120, note="the same words")
    enqueue(queue, "mail.send", 5)  # newer, and outside the filter below
    web = client(queue)
    wanted = "status=queued&type=mail.send&queue=mail&since=1h"
    with backend.engine.begin() as conn:  # an error to search by on the filtered jobs only
        conn.execute(
            sa.text("UPDATE sqlqueue_jobs SET last_error = 'E: the same words' WHERE id <= :top"),
            {"top": made[-1]},
        )

    first = web.get(f"/jobs?{wanted}&error=same+words").text
    older = first.split('rel="next" href="')[1].split('"')[0].replace("&amp;", "&")
    second = web.get(older).text
    third_link = second.split('rel="next" href="')[1].split('"')[0].replace("&amp;", "&")
    third = web.get(third_link).text

    assert (
        older == f"/jobs?{wanted.replace('since', 'error=same+words&since')}&before_id={made[-50]}"
    )
    assert f'data-job-id="{made[-1]}"' in first
    assert first.count("data-job-id=") == 50
    assert f'data-job-id="{made[-51]}"' in second
    assert f'data-job-id="{made[0]}"' in third
    assert 'rel="next"' not in third
    assert third.count("data-job-id=") == 20


def test_a_last_page_that_is_full_has_no_link_to_an_empty_one(backend: Backend) -> None:
    queue = make_queue(backend)
    made = enqueue(queue, "mail.send", 100)  # exactly two pages
    web = client(queue)

    first = web.get("/jobs").text
    second = web.get(f"/jobs?before_id={made[-50]}").text

    assert 'rel="next"' in first
    assert second.count("data-job-id=") == 50
    assert f'data-job-id="{made[0]}"' in second
    assert 'rel="next"' not in second


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?status=sleeping", "status must be one of queued, running"),
        ("?before_id=abc", "before_id must be a job id"),
        ("?since=yesterday", "since: expected an ISO 8601 time"),
        ("?since=garbage&status=dead", "since: expected an ISO 8601 time"),
        ("?since=1000000d", "since: '1000000d' is longer than a century"),
        ("?before_id=0", "before_id must be a job id"),
        ("?error=%00", "error: contains a NUL character"),
        ("?type=a%00b", "type: contains a NUL character"),
    ],
)
def test_a_bad_filter_is_a_400_that_says_what_is_wrong(
    backend: Backend, query: str, message: str
) -> None:
    page = client(backend.queue()).get("/jobs" + query)

    assert page.status_code == 400
    assert message in page.text.replace("&#39;", "'")


def test_job_page_shows_payload_redacted_every_attempt_and_times(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue)

    charge = web.get(f"/jobs/{ids['charge'][0]}").text
    flaky = web.get(f"/jobs/{ids['failed'][0]}").text
    missing = web.get("/jobs/987654")

    assert "tok_live_SECRET" not in charge
    assert "&#34;token&#34;: &#34;***&#34;" in charge or '"token": "***"' in charge
    assert "&#34;amount&#34;: 5" in charge or '"amount": 5' in charge
    assert "ValueError: card declined" in charge
    assert 'id="errors"' in flaky
    assert "TimeoutError: endpoint timed out" in flaky
    assert " UTC" in flaky.split('id="errors"')[1]  # the attempt's time
    assert missing.status_code == 404
    assert "there is no job 987654" in missing.text


def test_a_secret_never_appears_in_any_page(backend: Backend) -> None:
    canary = "canary-7f3a91-never-shown"
    queue = backend.queue(encryption_keys=[KEY])

    @queue.task("pay", queue="billing", max_attempts=1, secret_fields=["card"])
    def pay(card: str, amount: int) -> None:
        raise ValueError(f"card {card} declined")  # the error names the secret too

    @queue.task(
        "pay.later", queue="billing", max_attempts=3, backoff=[3600], secret_fields=["card"]
    )
    def pay_later(card: str) -> None:
        raise TimeoutError(f"gateway timed out charging {card}")

    with queue.engine.begin() as conn:
        dead = queue.enqueue(conn, "pay", {"card": canary, "amount": 5})
        failed = queue.enqueue(conn, "pay.later", {"card": canary})
    drain(queue)
    web = client(queue)
    paths = ["/", "/chart", "/jobs", "/jobs?status=dead", "/jobs?error=declined",
             "/jobs?queue=billing", f"/jobs/{dead}", f"/jobs/{failed}"]  # fmt: skip

    pages = {path: web.get(path) for path in paths}

    assert {path: page.status_code for path, page in pages.items()} == dict.fromkeys(paths, 200)
    for path, page in pages.items():
        assert canary not in page.text, path
    assert "ValueError: card *** declined" in pages[f"/jobs/{dead}"].text
    assert "***" in pages[f"/jobs/{failed}"].text.split('id="payload"')[1].split("</pre>")[0]
    assert f'data-job-id="{dead}"' in pages["/jobs?error=declined"].text


def test_job_page_lists_every_failed_attempt_with_its_own_error_and_time(
    backend: Backend,
) -> None:
    queue = backend.queue()
    seen: list[int] = []

    @queue.task("twice", max_attempts=3, backoff=[0, 0])
    def twice() -> None:
        seen.append(len(seen) + 1)
        raise RuntimeError(f"attempt {len(seen)} broke")

    with queue.engine.begin() as conn:
        job_id = queue.enqueue(conn, "twice", {})
    drain(queue)

    html = client(queue).get(f"/jobs/{job_id}").text
    errors = html.split('id="errors"')[1].split("<tbody>", 1)[1].split("</tbody>")[0]
    rows = errors.split("<tr>")[1:]

    assert len(rows) == 3
    for number, row in enumerate(rows, start=1):
        assert f'<td class="num">{number}</td>' in row
        assert f"RuntimeError: attempt {number} broke" in row
        assert re.search(r'<td class="when">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>', row)


# -- the dead-letter actions --------------------------------------------------------------------


def test_requeue_one_dead_job_links_both_ways_and_records_who_and_why(backend: Backend) -> None:
    queue, ids = populated(backend)
    dead = ids["dead_503"][0]
    web = client(queue, current_user=lambda request: request.headers.get("x-user", "nobody"))
    token = token_of(web.get(f"/jobs/{dead}").text)

    answer = web.post(
        f"/jobs/{dead}/requeue",
        data={"csrf_token": token, "reason": "CRM is back"},
        headers={"x-user": "ada@example.com"},
    )

    assert answer.status_code == 303
    assert answer.headers["location"] == f"/jobs/{dead}"
    old = queue.get_job(dead)
    assert old is not None
    assert old.requeued_as is not None
    assert (old.requeued_by, old.requeue_reason) == ("ada@example.com", "CRM is back")
    page = web.get(f"/jobs/{dead}").text
    assert f'Requeued as <a href="/jobs/{old.requeued_as}">#{old.requeued_as}</a>' in page
    assert "ada@example.com" in page
    assert "CRM is back" in page
    assert 'id="actions"' not in page  # handled: no more actions
    new = web.get(f"/jobs/{old.requeued_as}").text
    assert f'Requeued from dead job <a href="/jobs/{dead}">#{dead}</a>' in new


def test_discard_one_dead_job_shows_who_and_why(backend: Backend) -> None:
    queue, ids = populated(backend)
    dead = ids["dead_410"][0]
    web = client(queue)
    token = token_of(web.get(f"/jobs/{dead}").text)

    answer = web.post(f"/jobs/{dead}/discard", data={"csrf_token": token, "reason": "gone"})

    assert answer.status_code == 303
    page = web.get(f"/jobs/{dead}").text
    assert 'id="discarded"' in page
    assert ">web<" in page
    assert "gone" in page


def test_requeue_every_dead_job_matching_the_filter(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue)
    token = token_of(web.get("/jobs?status=dead&error=503").text)

    answer = web.post(
        "/jobs/requeue", data={"csrf_token": token, "error": "503", "reason": "CRM fixed"}
    )

    assert answer.status_code == 303
    assert answer.headers["location"] == "/jobs?status=dead&error=503&requeued=2"
    assert "Requeued 2 dead job(s)" in web.get(answer.headers["location"]).text
    handled = [queue.get_job(job_id) for job_id in ids["dead_503"]]
    assert all(job is not None and job.requeue_reason == "CRM fixed" for job in handled)
    untouched = queue.get_job(ids["dead_410"][0])
    assert untouched is not None
    assert untouched.requeued_as is None


def test_discard_every_dead_job_matching_the_filter(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue)
    token = token_of(web.get("/jobs?status=dead&queue=billing").text)

    answer = web.post(
        "/jobs/discard", data={"csrf_token": token, "queue": "billing", "reason": "test card"}
    )

    assert answer.headers["location"] == "/jobs?status=dead&queue=billing&discarded=1"
    charge = queue.get_job(ids["charge"][0])
    assert charge is not None
    assert charge.discard_reason == "test card"


def test_a_bulk_action_without_a_filter_or_a_reason_changes_nothing(backend: Backend) -> None:
    queue, _ = populated(backend)
    web = client(queue)
    token = token_of(web.get("/").text)
    before = dead_snapshot(backend.engine)

    everything = web.post("/jobs/requeue", data={"csrf_token": token, "reason": "all"})
    no_reason = web.post("/jobs/discard", data={"csrf_token": token, "error": "503"})
    blank = web.post("/jobs/requeue", data={"csrf_token": token, "error": "503", "reason": " "})

    assert everything.status_code == 400
    assert "refusing to requeue every dead job" in everything.text
    assert no_reason.status_code == 400
    assert "give a reason" in no_reason.text
    assert blank.status_code == 400
    assert dead_snapshot(backend.engine) == before


@pytest.mark.parametrize("action", ["requeue", "discard"])
def test_acting_on_one_job_without_a_reason_is_a_400_that_changes_nothing(
    backend: Backend, action: str
) -> None:
    queue, ids = populated(backend)
    dead = ids["dead_503"][0]
    web = client(queue)
    token = token_of(web.get(f"/jobs/{dead}").text)
    before = dead_snapshot(backend.engine)

    answers = [
        web.post(f"/jobs/{dead}/{action}", data={"csrf_token": token}),
        web.post(f"/jobs/{dead}/{action}", data={"csrf_token": token, "reason": "   "}),
        web.post(f"/jobs/{dead}/{action}", data={"csrf_token": token, "reason": "a\x00b"}),
        web.post("/queues/pause", data={"csrf_token": token, "queue": "mail", "reason": ""}),
    ]

    assert [answer.status_code for answer in answers] == [400] * 4
    assert "give a reason" in answers[0].text
    assert "give a reason" in answers[1].text
    assert "reason contains a NUL character" in answers[2].text
    assert "give a reason" in answers[3].text
    assert dead_snapshot(backend.engine) == before


def test_requeue_of_a_job_that_is_not_dead_is_a_409_that_says_so(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue)
    token = token_of(web.get("/").text)

    answer = web.post(f"/jobs/{ids['ok'][0]}/requeue", data={"csrf_token": token, "reason": "x"})
    missing = web.post("/jobs/987654/requeue", data={"csrf_token": token, "reason": "x"})

    assert answer.status_code == 409
    assert "<h1>409</h1>" in answer.text
    assert "dead" in answer.text
    assert missing.status_code == 404
    assert "<h1>404</h1>" in missing.text


def test_pause_and_resume_a_queue_showing_who_paused_it_and_why(backend: Backend) -> None:
    queue, _ = populated(backend)
    web = client(queue, current_user=lambda request: request.headers.get("x-user", "nobody"))
    token = token_of(web.get("/").text)

    paused = web.post(
        "/queues/pause",
        data={"csrf_token": token, "queue": "mail", "reason": "db upgrade"},
        headers={"x-user": "grace"},
    )
    assert paused.status_code == 303
    assert paused.headers["location"] == "/"
    assert queue.paused_queues() == ["mail"]
    page = web.get("/").text
    mail_row = page.split('<tr data-queue="mail">')[1].split("</tr>")[0]
    assert '<span class="badge paused">paused</span>' in mail_row
    assert '<strong class="who">grace</strong>' in mail_row  # who paused it
    assert '<q class="why">db upgrade</q>' in mail_row  # and why
    assert "Resume</button>" in mail_row
    assert "Pause</button>" not in mail_row

    resumed = web.post("/queues/resume", data={"csrf_token": token, "queue": "mail"})
    assert resumed.status_code == 303
    assert resumed.headers["location"] == "/"
    assert queue.paused_queues() == []
    mail_row = web.get("/").text.split('<tr data-queue="mail">')[1].split("</tr>")[0]
    assert "paused" not in mail_row
    assert "Pause</button>" in mail_row


def test_set_and_lift_a_queue_limit_from_the_overview(backend: Backend) -> None:
    queue, _ = populated(backend)
    web = client(queue)
    token = token_of(web.get("/").text)

    set_ = web.post("/queues/limit", data={"csrf_token": token, "queue": "mail", "limit": "4"})
    assert set_.status_code == 303
    assert queue.stats().queues["mail"].max_running == 4
    mail_row = web.get("/").text.split('<tr data-queue="mail">')[1].split("</tr>")[0]
    assert 'name="limit" min="1" size="4" value="4"' in mail_row
    bad = web.post("/queues/limit", data={"csrf_token": token, "queue": "mail", "limit": "-1"})
    assert bad.status_code == 400
    assert "whole number" in bad.text
    assert queue.stats().queues["mail"].max_running == 4
    lifted = web.post("/queues/limit", data={"csrf_token": token, "queue": "mail", "limit": ""})
    assert lifted.status_code == 303
    assert queue.stats().queues["mail"].max_running is None


# -- safety -------------------------------------------------------------------------------------

#: Every state-changing endpoint, with a form that would change something.
ACTIONS: list[tuple[str, Callable[[dict[str, list[int]]], str], dict[str, str]]] = [
    ("requeue", lambda ids: f"/jobs/{ids['dead_503'][0]}/requeue", {"reason": "r"}),
    ("discard", lambda ids: f"/jobs/{ids['dead_503'][0]}/discard", {"reason": "r"}),
    ("requeue", lambda ids: "/jobs/requeue", {"reason": "r", "error": "503"}),
    ("discard", lambda ids: "/jobs/discard", {"reason": "r", "error": "503"}),
    ("pause", lambda ids: "/queues/pause", {"reason": "r", "queue": "mail"}),
    ("pause", lambda ids: "/queues/limit", {"limit": "3", "queue": "mail"}),
]
ACTION_IDS = [
    "requeue-one",
    "discard-one",
    "requeue-matching",
    "discard-matching",
    "pause",
    "limit",
]


@pytest.fixture
def safety(backend: Backend) -> tuple[sqlqueue.Queue, dict[str, list[int]]]:
    queue, ids = populated(backend)
    queue.pause("hooks", by="ops", reason="resume me")  # so that resume would change something
    return queue, ids


@pytest.mark.parametrize(("action", "path", "form"), ACTIONS, ids=ACTION_IDS)
def test_a_post_without_the_csrf_token_or_with_a_wrong_one_is_a_403_and_changes_nothing(
    backend: Backend, safety: Any, action: str, path: Any, form: dict[str, str]
) -> None:
    queue, ids = safety
    web = client(queue)
    token = token_of(web.get("/").text)  # the browser holds the cookie
    before = dead_snapshot(backend.engine)

    missing = web.post(path(ids), data=form)
    wrong = web.post(path(ids), data={**form, "csrf_token": token[::-1]})
    other_cookie = client(queue)  # a token of another session (its own cookie) does not pass
    other_cookie.cookies.set("sqlqueue_csrf", "x" * 43)
    forged = other_cookie.post(path(ids), data={**form, "csrf_token": token})

    assert (missing.status_code, wrong.status_code, forged.status_code) == (403, 403, 403)
    assert "security token" in missing.text
    assert dead_snapshot(backend.engine) == before


def test_resume_without_the_csrf_token_is_a_403_too(backend: Backend, safety: Any) -> None:
    queue, _ = safety
    web = client(queue)
    web.get("/")

    answer = web.post("/queues/resume", data={"queue": "hooks"})

    assert answer.status_code == 403
    assert queue.paused_queues() == ["hooks"]


@pytest.mark.parametrize(("action", "path", "form"), ACTIONS, ids=ACTION_IDS)
def test_nothing_changes_on_get(
    backend: Backend, safety: Any, action: str, path: Any, form: dict[str, str]
) -> None:
    queue, ids = safety
    web = client(queue)
    before = dead_snapshot(backend.engine)

    answer = web.get(path(ids), params=form)

    assert answer.status_code == 405
    assert dead_snapshot(backend.engine) == before


@pytest.mark.parametrize(("action", "path", "form"), ACTIONS, ids=ACTION_IDS)
def test_authorize_refuses_an_action_with_a_403_and_hides_its_button(
    backend: Backend, safety: Any, action: str, path: Any, form: dict[str, str]
) -> None:
    queue, ids = safety
    asked: list[str] = []

    def authorize(request: Request, wanted: str) -> bool:
        asked.append(wanted)
        return wanted != action

    web = client(queue, authorize=authorize)
    dead_page = web.get(f"/jobs/{ids['dead_503'][0]}").text
    overview = web.get("/").text
    token = token_of(dead_page + overview)
    before = dead_snapshot(backend.engine)

    answer = web.post(path(ids), data={**form, "csrf_token": token})

    assert answer.status_code == 403
    assert f"you may not {action} here" in answer.text
    assert dead_snapshot(backend.engine) == before
    assert action in asked
    shown = {
        "requeue": 'class="requeue"' in dead_page,
        "discard": 'class="discard"' in dead_page,
        "pause": "Pause</button>" in overview,
    }
    assert shown == {name: name != action for name in shown}


def test_authorize_can_refuse_viewing(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue, authorize=lambda request, action: False)

    for path in ("/", "/chart", "/jobs", f"/jobs/{ids['ok'][0]}"):
        answer = web.get(path)
        assert answer.status_code == 403, path
        assert "mail.send" not in answer.text


def test_read_only_hides_and_refuses_every_action(backend: Backend, safety: Any) -> None:
    queue, ids = safety
    web = client(queue, read_only=True)
    pages = [web.get(path).text for path in ("/", f"/jobs/{ids['dead_503'][0]}", "/jobs?error=5")]
    token = token_of(pages[0].replace("<head>", '<i name="csrf_token" value="x">'))
    before = dead_snapshot(backend.engine)

    answers = [web.post(path(ids), data={**form, "csrf_token": token}) for _, path, form in ACTIONS]

    assert all('method="post"' not in page for page in pages)
    assert all("read-only" in page for page in pages)
    assert [answer.status_code for answer in answers] == [403] * len(ACTIONS)
    assert dead_snapshot(backend.engine) == before


def test_user_data_is_escaped_everywhere(backend: Backend) -> None:
    queue = backend.queue()
    evil = "<script>alert(1)</script>"

    @queue.task(f"x{evil}", queue=f"q{evil}"[:100], max_attempts=1)
    def boom(note: str = evil) -> None:
        raise ValueError(evil)

    with queue.engine.begin() as conn:
        job_id = queue.enqueue(conn, f"x{evil}", {"note": evil})
    drain(queue)
    queue.pause(f"p{evil}", by=f"u{evil}", reason=f"r{evil}")  # shown with a Resume form
    web = client(queue, current_user=lambda request: evil)
    token = token_of(web.get("/").text)
    web.post(f"/jobs/{job_id}/discard", data={"csrf_token": token, "reason": evil})

    paths = ["/", "/jobs", f"/jobs?error={evil}&type={evil}", f"/jobs/{job_id}",
             f"/jobs?status={evil}", f"/jobs?since={evil}"]  # fmt: skip
    pages = {path: web.get(path) for path in paths}

    overview = pages["/"].text
    assert 'name="queue" value="q&lt;script&gt;alert(1)&lt;/script&gt;"' in overview  # Pause
    assert 'name="queue" value="p&lt;script&gt;alert(1)&lt;/script&gt;"' in overview  # Resume
    assert "u&lt;script&gt;alert(1)&lt;/script&gt;" in overview  # who paused it
    assert "r&lt;script&gt;alert(1)&lt;/script&gt;" in overview  # and why
    assert (
        'name="error" value="&lt;script&gt;alert(1)&lt;/script&gt;"'
        in pages[f"/jobs?error={evil}&type={evil}"].text
    )  # the search box
    assert 'id="discarded"' in pages[f"/jobs/{job_id}"].text  # by and why: the user's text
    assert pages[f"/jobs?status={evil}"].status_code == 400  # the message quotes the value
    assert pages[f"/jobs?since={evil}"].status_code == 400
    for path, page in pages.items():
        assert evil not in page.text, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text, path


# -- mounted and standalone ---------------------------------------------------------------------


def test_mounted_under_a_prefix_every_link_and_action_keeps_the_prefix(backend: Backend) -> None:
    queue, ids = populated(backend)
    host = Starlette(routes=[Mount("/ops/jobs-ui", app=create_app(queue))])
    web = browser_client(host)

    queue.pause("billing", by="ops", reason="so that the overview has a Resume form")
    dead = ids["dead_503"][0]
    first = web.get("/ops/jobs-ui/")
    pages = [
        first.text,
        web.get("/ops/jobs-ui/jobs?status=dead&error=503").text,  # with the bulk forms
        web.get(f"/ops/jobs-ui/jobs?before_id={ids['queued'][-1]}").text,  # paged
        web.get(f"/ops/jobs-ui/jobs/{dead}").text,  # with the one-job forms
        web.get("/ops/jobs-ui/jobs/987654").text,  # the error page
    ]
    token = token_of(pages[3])

    def post(path: str, **form: str) -> httpx2.Response:  # TestClient's client (Starlette)
        return web.post("/ops/jobs-ui" + path, data={"csrf_token": token, **form})

    answers = {
        "requeue": post(f"/jobs/{dead}/requeue", reason="mounted"),
        "discard": post(f"/jobs/{ids['dead_410'][0]}/discard", reason="mounted"),
        "requeue_matching": post("/jobs/requeue", error="503", reason="mounted"),
        "discard_matching": post("/jobs/discard", queue="billing", reason="mounted"),
        "pause": post("/queues/pause", queue="mail", reason="mounted"),
        "resume": post("/queues/resume", queue="billing"),
    }

    for page in pages:
        targets = re.findall(r'(?:href|src|action|data-refresh-url)="([^"]*)"', page)
        assert len(targets) > 5
        assert all(target.startswith("/ops/jobs-ui/") for target in targets), targets
    assert 'action="/ops/jobs-ui/jobs/requeue"' in pages[1]
    assert f'action="/ops/jobs-ui/jobs/{dead}/requeue"' in pages[3]
    assert 'action="/ops/jobs-ui/queues/resume"' in pages[0]
    assert 'data-refresh-url="/ops/jobs-ui/chart"' in pages[0]
    assert web.get("/ops/jobs-ui/static/style.css").status_code == 200
    assert web.get("/ops/jobs-ui/chart").text.lstrip().startswith("<svg")
    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys(
        answers, 303
    )
    assert all(
        answer.headers["location"].startswith("/ops/jobs-ui/") for answer in answers.values()
    )
    assert answers["requeue"].headers["location"] == f"/ops/jobs-ui/jobs/{dead}"
    assert answers["pause"].headers["location"] == "/ops/jobs-ui/"
    assert "Path=/ops/jobs-ui/" in first.headers["set-cookie"]  # the token's cookie stays too


def test_the_web_command_serves_the_page_and_read_only_hides_the_actions(
    backend: Backend, tmp_path: Path
) -> None:
    populated(backend)
    with web_command(
        "--database-url", backend.url, "--read-only", log=tmp_path / "web.log"
    ) as port:
        page = httpx.get(f"http://127.0.0.1:{port}/jobs?status=dead", timeout=10)
    assert page.status_code == 200
    assert "crm.sync" in page.text
    assert 'method="post"' not in page.text


def test_the_web_command_help_says_what_it_serves_and_that_it_has_no_login() -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "sqlqueue", "web", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert answer.returncode == 0
    text = " ".join(answer.stdout.split())
    for option in ("--database-url", "--host", "--port", "--read-only", "--allowed-host"):
        assert option in text
    assert "no login of its own" in text
    assert "sqlqueue.web.create_app" in text
    assert "default 127.0.0.1" in text


@pytest.mark.parametrize(
    ("url", "status", "message"),
    [
        ("nonsense", 2, "--database-url: cannot use 'nonsense'"),
        ("postgresql+psycopg://postgres@127.0.0.1:1/none", 3, "cannot reach PostgreSQL"),
    ],
)
def test_the_web_command_refuses_a_bad_database_url_with_a_clear_message(
    url: str, status: int, message: str
) -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "sqlqueue", "web", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert answer.returncode == status
    assert message in answer.stderr
    assert "Traceback" not in answer.stderr


def test_the_web_command_says_what_is_wrong_with_its_database(tmp_path: Any) -> None:
    missing = tmp_path / "missing.db"
    answer = subprocess.run(
        [sys.executable, "-m", "sqlqueue", "web", "--database-url", f"sqlite:///{missing}"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert answer.returncode == 3
    assert "sqlqueue migrate" in answer.stderr


def test_the_web_package_reads_through_the_queue_never_the_store() -> None:
    package = Path(sqlqueue.web.__file__).parent
    trees = [parse(path.read_text()) for path in package.glob("*.py")]
    imported = {
        node.module or ""
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    below = sorted(
        name for name in imported if name.startswith(("sqlqueue._store", "sqlqueue.dialects"))
    )
    # Nor through a Queue's store, admin, engine or dialect: only its operations API.
    reached = sorted(
        node.attr
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in {"store", "admin", "engine", "dialect", "keyring"}
    )
    assert below == []
    assert reached == []


def test_a_database_that_is_not_migrated_is_a_503_that_says_what_to_run(tmp_path: Path) -> None:
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'empty.db'}")

    answer = client(queue).get("/")

    assert answer.status_code == 503
    assert "sqlqueue migrate" in answer.text


def test_the_chart_scales_to_a_round_top_and_puts_the_busiest_minute_at_it() -> None:
    start = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    minutes = tuple(
        sqlqueue.MinuteActivity(
            start=start + timedelta(minutes=index),
            succeeded=17 if index == 30 else 1,
            failed=2 if index == 59 else 0,
            dead=1 if index == 59 else 0,
        )
        for index in range(60)
    )
    chart = chart_of(sqlqueue.Activity(minutes=minutes, taken_at=start + timedelta(hours=1)))

    assert chart.top_value == 20
    assert (chart.total_succeeded, chart.total_failures) == (76, 3)
    points = [point.split(",") for point in chart.succeeded_points.split()]
    assert len(points) == 60
    busiest = float(points[30][1])
    assert busiest == pytest.approx(chart.plot_bottom - (chart.plot_bottom - chart.plot_top) * 0.85)
    assert float(chart.failures_points.split()[-1].split(",")[0]) == chart.plot_right
    assert [label for _, label, _ in chart.x_labels] == [
        "-60 min", "-45 min", "-30 min", "-15 min", "now",
    ]  # fmt: skip


def test_the_pages_load_nothing_from_another_site(backend: Backend) -> None:
    queue, ids = populated(backend)
    web = client(queue)

    for path in ("/", "/jobs", f"/jobs/{ids['dead_503'][0]}"):
        html = web.get(path).text
        assert not re.search(r'(src|href|action)="(https?:)?//', html), path
