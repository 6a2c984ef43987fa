"""The web page in a real headless Chromium (Debian's ``chromium``, driven by Playwright), served
by uvicorn against each backend's database: an operator loads the overview, filters the list
by error text, opens a dead job, requeues it with a reason, sees the new job appear and the old
one link to it — and the same page mounted under a prefix in a host app. And as an attacker
would try it: a page on another port that plants its own CSRF cookie and posts a form, frames
the page, or a name rebound to 127.0.0.1 (Chromium's own resolver maps ``rebound.test``).

Without chromium (or Playwright) the tests skip, except with ``CI=true``, where they fail.
``SQLQUEUE_SCREENSHOTS=1`` writes ``docs/screenshots/overview.png`` and ``dead_job.png``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse
from starlette.routing import Mount, Route

import sqlqueue
from sqlqueue.web import create_app
from tests._support import drain
from tests._support.web import make_queue, populated, serving
from tests.conftest import IN_CI, Backend

T = TypeVar("T")

#: The page in a browser is the subject: what it shows comes from the operations API, whose
#: queries tests/test_web*.py and tests/test_operations*.py run on every backend.
BROWSER = pytest.mark.backend_independent("a page in a browser")
pytestmark = BROWSER

SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
WANT_SCREENSHOTS = os.environ.get("SQLQUEUE_SCREENSHOTS", "") == "1"


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(f"{message} (CI=true: the browser tests must run)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's chromium, launched headless once for the module."""
    executable = os.environ.get("SQLQUEUE_TEST_CHROMIUM") or shutil.which("chromium")
    if executable is None:
        _unavailable("chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    # expect() polls for its condition; its default 5 s is short for a loaded 2-core machine
    # where a POST, a redirect and a database read follow each other.
    expect.set_options(timeout=30_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            # rebound.test: a name whose owner pointed it at this machine (DNS rebinding).
            args=["--no-sandbox", "--host-resolver-rules=MAP rebound.test 127.0.0.1"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A fresh browser tab (its own cookies); fails the test on any console error, such as a
    script or style the page's Content-Security-Policy blocked."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    errors: list[str] = []
    tab.on(
        "console", lambda message: errors.append(message.text) if message.type == "error" else None
    )
    tab.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield tab
    finally:
        context.close()
    assert errors == []


def outside_the_browser_loop(make: Callable[[Backend], T], backend: Backend) -> T:
    """``make(backend)`` in a thread of its own: Playwright's sync API keeps an event loop
    running on this thread, where a burst worker (``asyncio.run``) cannot start."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(make, backend).result()


def busy_hour(backend: Backend) -> tuple[sqlqueue.Queue, dict[str, list[int]]]:
    return populated(backend, history=True)


def shoot(page: Any, name: str) -> None:
    if WANT_SCREENSHOTS:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def test_an_operator_finds_a_dead_job_by_its_error_and_requeues_it(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue, ids = outside_the_browser_loop(busy_hour, backend)
    app = create_app(queue, current_user=lambda request: "ada", refresh_seconds=1)
    with serving(app) as base:
        # The overview: counts, queues, top errors and a chart that reloads itself.
        page.goto(base + "/")
        expect(page.locator("h1")).to_have_text("Overview")
        expect(page.locator('[data-count="dead"]')).to_have_text("16")
        expect(page.locator("#queues tr[data-queue='hooks']")).to_be_visible()
        expect(page.locator("#top-errors")).to_contain_text("503 from crm")
        expect(page.locator("#chart svg polyline.succeeded")).to_be_visible()
        assert (
            page.locator("header.top").evaluate("e => getComputedStyle(e).backgroundColor")
            == "rgb(17, 24, 39)"
        )  # the stylesheet loaded
        first = page.locator("[data-taken-at]").inner_text()
        expect(page.locator("[data-taken-at]")).not_to_have_text(first, timeout=20_000)
        shoot(page, "overview.png")

        # The list, filtered by error text.
        page.get_by_role("link", name="Jobs", exact=True).click()
        page.locator("select[name=status]").select_option("dead")
        page.locator("input[name=error]").fill("503 from")
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(re.compile(r"/jobs\?status=dead&.*error=503\+from"))
        rows = page.locator("#jobs tbody tr")
        expect(rows).to_have_count(2)

        # The dead job: its error, with the attempt's time; requeue it with a reason.
        dead = ids["dead_503"][-1]
        page.locator(f'#jobs a[href$="/jobs/{dead}"]').click()
        expect(page.locator("h1")).to_contain_text(f"Job #{dead}")
        expect(page.locator("#errors")).to_contain_text("ConnectionError: 503 from crm")
        shoot(page, "dead_job.png")
        page.get_by_label("reason to requeue").fill("CRM is back up")
        page.get_by_role("button", name="Requeue as a new job").click()

        # Back on the dead job: who, why, and a link to the new job, which links back.
        note = page.locator("#requeued-as")
        expect(note).to_contain_text("ada")
        expect(note).to_contain_text("CRM is back up")
        expect(page.locator("#actions")).to_have_count(0)
        new_id = int(str(note.locator("a").get_attribute("href")).rsplit("/", 1)[1])
        note.locator("a").click()
        expect(page).to_have_url(re.compile(rf"/jobs/{new_id}$"))
        expect(page.locator("h1")).to_contain_text(f"Job #{new_id}")
        expect(page.locator("h1 .status")).to_have_text("queued")
        page.locator("#requeued-from a").click()
        expect(page).to_have_url(re.compile(rf"/jobs/{dead}$"))

        # The new job appears in the list.
        page.get_by_role("link", name="Jobs", exact=True).click()
        page.locator("input[name=type]").fill("crm.sync")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator(f'#jobs tr[data-job-id="{new_id}"]')).to_contain_text("queued")
        page.goto("about:blank")  # no page left polling the server while it stops


def test_the_page_mounted_under_a_prefix_in_a_host_app_keeps_its_links(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue, ids = outside_the_browser_loop(populated, backend)

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("the host app")

    page_app = create_app(queue, current_user=lambda r: "grace", refresh_seconds=1)
    host = Starlette(routes=[Route("/", home), Mount("/admin/queue", app=page_app)])
    with serving(host) as base:
        asked: list[str] = []  # every URL the browser fetches: pages, assets, chart, POSTs
        page.on("request", lambda request: asked.append(request.url))
        page.goto(base + "/admin/queue/")
        expect(page.locator("h1")).to_have_text("Overview")
        assert (
            page.locator("header.top").evaluate("e => getComputedStyle(e).backgroundColor")
            == "rgb(17, 24, 39)"
        )
        first = page.locator("[data-taken-at]").inner_text()
        expect(page.locator("[data-taken-at]")).not_to_have_text(first)  # the chart refreshed

        # Pause a queue, then resume it: each form posts under the prefix and comes back.
        page.get_by_label("reason to pause mail").fill("mail provider down")
        page.locator("tr[data-queue='mail']").get_by_role("button", name="Pause").click()
        expect(page).to_have_url(base + "/admin/queue/")
        mail = page.locator("tr[data-queue='mail']")
        expect(mail.locator(".pause-note")).to_contain_text("grace")
        expect(mail.locator(".pause-note")).to_contain_text("mail provider down")
        mail.get_by_role("button", name="Resume").click()
        expect(mail.get_by_role("button", name="Pause")).to_be_visible()
        expect(page.locator("tr[data-queue='mail'] .badge.paused")).to_have_count(0)

        page.get_by_role("link", name="Dead", exact=True).click()
        expect(page).to_have_url(base + "/admin/queue/jobs?status=dead")
        dead = ids["dead_410"][0]
        page.locator(f'#jobs a[href$="/jobs/{dead}"]').click()
        expect(page).to_have_url(f"{base}/admin/queue/jobs/{dead}")
        page.get_by_label("reason to discard").fill("the record is gone")
        page.get_by_role("button", name="Discard").click()

        expect(page).to_have_url(f"{base}/admin/queue/jobs/{dead}")
        expect(page.locator("#discarded")).to_contain_text("grace")
        page.get_by_role("link", name="sqlqueue").click()
        expect(page).to_have_url(base + "/admin/queue/")
        assert httpx.get(base + "/").text == "the host app"  # the host's own routes still work
        assert queue.paused_queues() == []
        outside = [url for url in asked if not url.startswith(base + "/admin/queue/")]
        assert outside == []  # no link, asset, refresh or redirect left the prefix
        assert any(url.endswith("/admin/queue/chart") for url in asked)
        assert any(url.endswith("/admin/queue/static/sqlqueue.js") for url in asked)
        # The overview refreshes its chart every second: leave it before the server stops, or
        # a refresh that meets the closed port logs a console error and fails the test.
        page.goto("about:blank")


def dead_jobs(backend: Backend) -> tuple[sqlqueue.Queue, dict[str, list[int]]]:
    """Two dead ``crm.sync`` jobs."""
    queue = make_queue(backend)
    with queue.engine.begin() as conn:
        made = [queue.enqueue(conn, "crm.sync", {"n": n}) for n in range(2)]
    drain(queue)
    return queue, {"dead": made}


def test_a_page_on_another_port_that_plants_its_cookie_can_neither_act_nor_frame_the_page(
    backend: Backend, chromium: Any
) -> None:
    from playwright.sync_api import expect

    queue, ids = outside_the_browser_loop(dead_jobs, backend)
    dead = ids["dead"][0]
    planted = "P" * 43  # cookies do not separate ports: 127.0.0.1:any sets it for the page too
    context = chromium.new_context()
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    with serving(create_app(queue)) as base:

        async def lure(request: Request) -> HTMLResponse:
            form = (
                f'<form method="post" action="{base}/jobs/{dead}/requeue">'
                f'<input type="hidden" name="csrf_token" value="{planted}">'
                '<input type="hidden" name="reason" value="planted">'
                "<button>Claim your prize</button></form>"
                f'<iframe id="framed" src="{base}/jobs/{dead}"></iframe>'
            )
            page = HTMLResponse(f"<!doctype html><title>prize</title>{form}")
            page.set_cookie("sqlqueue_csrf", planted, path="/", samesite="lax")
            return page

        with serving(Starlette(routes=[Route("/", lure)])) as evil:
            tab.goto(base + f"/jobs/{dead}")  # the operator has the page open
            expect(tab.locator("h1")).to_contain_text(f"Job #{dead}")
            tab.goto(evil + "/")  # and visits another site on the same machine
            framed = tab.frame_locator("#framed")
            expect(framed.locator("body")).not_to_contain_text("crm.sync")  # framing refused
            tab.get_by_role("button", name="Claim your prize").click()
            expect(tab.locator("h1")).to_have_text("403")
            expect(tab.locator(".message")).to_contain_text("not from this page")

        cookies = {c["name"]: c["value"] for c in context.cookies(base)}
        assert cookies["sqlqueue_csrf"] == planted  # the cookie was planted, and did not help
        job = queue.get_job(dead)
        assert job is not None
        assert job.requeued_as is None
        # The operator's own page still works with the planted nonce: only the key signs.
        tab.goto(base + f"/jobs/{dead}")
        tab.get_by_label("reason to requeue").fill("after the attack")
        tab.get_by_role("button", name="Requeue as a new job").click()
        expect(tab.locator("#requeued-as")).to_contain_text("after the attack")
    context.close()


def test_a_name_rebound_to_this_machine_reads_nothing(backend: Backend, chromium: Any) -> None:
    from playwright.sync_api import expect

    queue, _ = outside_the_browser_loop(dead_jobs, backend)
    context = chromium.new_context()  # not the page fixture: the refusal logs a console error
    page = context.new_page()
    page.set_default_timeout(30_000)
    with serving(create_app(queue)) as base:
        port = base.rsplit(":", 1)[1]
        rebound = page.goto(f"http://rebound.test:{port}/jobs?status=dead")
        assert rebound is not None
        assert rebound.status == 400
        expect(page.locator("body")).to_contain_text("not served as the host 'rebound.test:")
        expect(page.locator("body")).not_to_contain_text("crm.sync")
        assert page.context.cookies(f"http://rebound.test:{port}") == []
        served = page.goto(f"{base}/jobs?status=dead")  # control: the page's own address
        assert served is not None
        assert served.status == 200
        expect(page.locator("#jobs")).to_contain_text("crm.sync")
    context.close()


#: Names as real apps spell them: dotted job types and hyphenated queue names, long enough
#: that a careless table breaks them mid-word at a laptop's 1280 px.
LONG_TYPES = {
    "billing.invoices.render_monthly_statement_pdf": "billing-statements-eu-west-1",
    "notifications.email.send_password_reset_link": "transactional-mail-high-priority",
    "analytics.warehouse.export_daily_signup_cohorts": "analytics-batch-nightly",
    "crm.salesforce.sync_contact_with_custom_fields": "partner-webhooks-salesforce",
}


def long_names(backend: Backend) -> sqlqueue.Queue:
    """Jobs of the long-named types: some succeeded, some dead with a long error, some queued."""
    queue = backend.queue()
    for job_type, queue_name in LONG_TYPES.items():

        def fail(account_id: int, job_type: str = job_type) -> None:
            if account_id % 2:
                raise ConnectionError(
                    f"HTTPSConnectionPool(host='eu.api.example.com', port=443): max retries "
                    f"exceeded with url /v59.0/accounts/{account_id}/{job_type} (503 Service "
                    "Unavailable)"
                )

        queue.task(job_type, queue=queue_name, max_attempts=1)(fail)
    with queue.engine.begin() as conn:
        for account_id in range(3):
            for job_type in LONG_TYPES:
                queue.enqueue(conn, job_type, {"account_id": 1_048_570 + account_id})
    drain(queue)
    with queue.engine.begin() as conn:
        for job_type in LONG_TYPES:
            queue.enqueue(conn, job_type, {"account_id": 7}, delay=3600)
    return queue


#: For each id, type and queue cell of the job list: its text, its box's height and line height,
#: whether the text is clipped (scrollWidth > clientWidth), its text-overflow and title.
CELL_GEOMETRY = """() => [...document.querySelectorAll('#jobs tbody tr')].flatMap(row =>
  ['id', 'type', 'queue'].map(column => {
    const cell = row.querySelector(`td.${column}`);
    const text = cell.querySelector('.one-line') || cell;
    const style = getComputedStyle(text);
    return {
      column, text: text.textContent.trim(), height: text.getBoundingClientRect().height,
      lineHeight: parseFloat(style.lineHeight), clipped: text.scrollWidth > text.clientWidth,
      overflow: style.textOverflow, title: text.getAttribute('title'),
    };
  }))"""


def test_the_job_list_keeps_ids_types_and_queues_on_one_line_at_1280_px(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue = outside_the_browser_loop(long_names, backend)
    with serving(create_app(queue)) as base:
        page.goto(base + "/jobs")
        expect(page.locator("#jobs tbody tr")).to_have_count(16)
        assert page.viewport_size == {"width": 1280, "height": 900}
        if WANT_SCREENSHOTS or os.environ.get("SQLQUEUE_SCREENSHOT_DIR"):
            where = Path(os.environ.get("SQLQUEUE_SCREENSHOT_DIR") or SCREENSHOTS)
            where.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(where / "jobs_1280.png"), full_page=True)
        cells = page.evaluate(CELL_GEOMETRY)
        assert len(cells) == 48
        for cell in cells:
            assert cell["height"] <= cell["lineHeight"] * 1.2, cell  # one line, not wrapped
            if cell["clipped"]:  # cut short, it says so and shows the whole name on hover
                assert (cell["overflow"], cell["title"]) == ("ellipsis", cell["text"]), cell
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 1280, "the page scrolls sideways"
        table, card = (
            page.locator(selector).evaluate("e => e.getBoundingClientRect().right")
            for selector in ("#jobs", "#jobs >> xpath=..")
        )
        assert table <= card, "the table sticks out of its card"
        shown = {cell["text"] for cell in cells if not cell["clipped"]}
        assert set(LONG_TYPES) <= shown, "the types fit whole at 1280 px"
        page.goto("about:blank")
