"""The web page's Workflows list and workflow page in a real headless Chromium (Debian's
``chromium`` driven by Playwright, as in ``test_web_browser.py``) served by uvicorn against
each backend's database: an operator finds the workflow held up by a dead step, opens it, reads
its graph and its steps, and requeues the dead step from the workflow page — the requeue read
back from the database, and the workflow finishing once a worker runs the new job.

``SQLQUEUE_SCREENSHOTS=1`` writes ``docs/screenshots/workflows.png`` and ``workflow.png``.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue.web import create_app
from tests import test_web_browser
from tests._support import drain
from tests._support.web import serving
from tests.conftest import Backend
from tests.test_web_browser import outside_the_browser_loop, shoot
from tests.test_web_workflows import orders

# The browser and a fresh tab, as the other browser tests have them.
chromium = test_web_browser.chromium
page = test_web_browser.page
pytestmark = test_web_browser.BROWSER


def test_the_workflows_list_leads_to_a_workflows_graph_and_steps_and_back(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue, handles = outside_the_browser_loop(orders, backend)
    held = handles["held"]
    with serving(create_app(queue)) as base:
        page.goto(base + "/")
        page.get_by_role("link", name="Workflows", exact=True).click()
        expect(page.locator("h1")).to_have_text("Workflows")
        rows = page.locator("#workflows tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.first).to_have_attribute("data-workflow-id", str(handles["cancelled"].id))
        row = page.locator(f'#workflows tr[data-workflow-id="{held.id}"]')
        expect(row).to_have_class("blocked")
        expect(row.locator(".blocked-by")).to_have_text("notify")
        expect(row.locator('[data-count="waiting"]')).to_have_text("1")
        expect(row.locator("svg.bar rect")).to_have_count(3)  # succeeded, dead, waiting
        shoot(page, "workflows.png")

        row.get_by_role("link", name=f"#{held.id}").click()
        expect(page.locator("h1")).to_contain_text(f"Workflow #{held.id}")
        expect(page.locator("h1 .badge")).to_have_text("held up")
        expect(page.locator("#blocked-by")).to_contain_text("notify (dead)")
        steps = page.locator("#steps tbody tr")
        expect(steps).to_have_count(4)
        assert [steps.nth(n).get_attribute("data-step") for n in range(4)] == [
            "charge",
            "notify",
            "receipt",
            "complete",
        ]
        graph = page.locator("#graph svg")
        expect(graph.locator("a.node")).to_have_count(4)
        expect(graph.locator("path.edge")).to_have_count(4)
        expect(graph.locator('a.node.blocked[data-step="notify"]')).to_be_visible()
        shoot(page, "workflow.png")

        graph.locator('a.node[data-step="receipt"]').click()  # a box leads to its job
        expect(page.locator("h1")).to_contain_text(f"Job #{held.job_ids['receipt']}")
        page.locator("#workflow a").first.click()  # and the job back to its workflow
        expect(page).to_have_url(re.compile(rf"/workflows/{held.id}$"))
        page.goto("about:blank")


def _fix_the_webhook(queue: sqlqueue.Queue, job_id: int) -> None:
    """What the operator fixed before requeueing: the payload that broke the webhook."""
    with queue.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE sqlqueue_jobs SET payload = :payload WHERE id = :id"),
            {"payload": '{"order": 2, "broken": false}', "id": job_id},
        )


def test_requeue_of_the_dead_step_from_the_workflow_page_lets_the_workflow_finish(
    backend: Backend, page: Any
) -> None:
    from playwright.sync_api import expect

    queue, handles = outside_the_browser_loop(orders, backend)
    held = handles["held"]
    dead = held.job_ids["notify"]
    _fix_the_webhook(queue, dead)
    with serving(create_app(queue, current_user=lambda request: "ada")) as base:
        page.goto(f"{base}/workflows/{held.id}")
        expect(page.locator("#steps form")).to_have_count(1)  # only the dead step has one
        page.get_by_label("reason to requeue step notify").fill("warehouse is back")
        page.locator('#steps tr[data-step="notify"]').get_by_role("button", name="Requeue").click()
        notice = page.locator("#requeued")
        expect(notice).to_contain_text("Requeued as job #")
        old = queue.get_job(dead)
        assert old is not None
        assert old.requeued_as is not None
        assert (old.requeued_by, old.requeue_reason) == ("ada", "warehouse is back")
        status = queue.get_workflow(held.id)
        assert status is not None
        assert status.steps["notify"].job_id == old.requeued_as
        notify = page.locator('#steps tr[data-step="notify"]')
        expect(notify.locator(".status")).to_have_text("queued")
        expect(notify.locator("td.id")).to_have_text(f"#{old.requeued_as}")
        expect(page.locator("#blocked-by")).to_have_count(0)

        outside_the_browser_loop(lambda _: drain(queue), backend)
        page.reload()
        expect(page.locator("h1 .badge")).to_have_text("finished")
        expect(page.locator('[data-count="succeeded"]')).to_have_text("4")
        page.goto("about:blank")
    status = queue.get_workflow(held.id)
    assert status is not None
    assert status.succeeded
