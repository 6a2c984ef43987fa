"""An order as a workflow: charged, then a receipt email and a warehouse webhook in parallel,
then marked complete — with a dead webhook that an operator requeues to finish the workflow.

Run it as it is (an SQLite file in a temporary directory)::

    pip install -e ".[demo]"
    python examples/workflow_order.py
    python examples/workflow_order.py --database-url postgresql+psycopg://user@host/db

It starts its own mail server (aiosmtpd) and warehouse receiver on free ports of 127.0.0.1 and
talks to nothing else. The warehouse is down at first (503): the webhook step dies, the
``complete`` step stays ``waiting`` (``on_dead="wait"``), the warehouse comes back, and support
runs ``sqlqueue dead requeue`` as in production; the new delivery takes the dead one's place in
the workflow and its success releases ``complete``, which reads the charge's result through
``ctx.upstream_results``. The program checks every claim and exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue

try:
    from aiosmtpd.controller import Controller

    from sqlqueue.email import SMTP, Content, Mailer
    from sqlqueue.webhooks import Webhooks, verify
except ImportError as missing:  # pragma: no cover - depends on the installation
    raise SystemExit(f'{missing}: the example needs its extra: pip install -e ".[demo]"') from None

URL_VARIABLE = "SQLQUEUE_DATABASE_URL"

orders = sa.Table(
    "example_orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("charge", sa.String(40), nullable=True),
)


class Inbox:
    """The mail server's handler: keeps every message it accepts."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.received.append(envelope.content)
        return "250 2.0.0 Ok"


class Warehouse:
    """The warehouse's webhook endpoint: 503 while down; once up, verifies and records."""

    def __init__(self) -> None:
        self.up = False
        self.secret = ""
        self.orders: list[int] = []
        warehouse = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                status = 503
                if warehouse.up:
                    event = verify(warehouse.secret, dict(self.headers.items()), body)
                    warehouse.orders.append(event["data"]["order"])
                    status = 200
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/orders"


def build_queue(engine: sa.Engine, smtp_port: int) -> tuple[sqlqueue.Queue, Mailer, Webhooks]:
    """The queue with the order's tasks, the Mailer and the Webhooks (short retries: the story
    fits in seconds; production uses their defaults)."""
    queue = sqlqueue.Queue(engine, lease_seconds=10.0)
    mailer = Mailer(
        queue, smtp=SMTP(host="127.0.0.1", port=smtp_port, starttls=False, timeout=5.0),
        sender="Shop <shop@example.com>", backoff=[0.2],
    )  # fmt: skip
    # allow_private_addresses: the warehouse listens on 127.0.0.1 here; never for partners' URLs.
    hooks = Webhooks(queue, timeout=5.0, max_attempts=2, backoff=[0.2],
                     allow_private_addresses=True)  # fmt: skip

    @mailer.template("receipt")
    def receipt(order: int) -> Content:
        return Content(subject=f"Receipt for order {order}", text=f"Order {order} is paid.")

    @queue.task("billing.charge")
    def charge(order: int) -> dict[str, str]:
        return {"charge_id": f"ch_{order}"}  # what the payment provider answered

    @queue.task("orders.complete")
    def complete(order: int, ctx: sqlqueue.JobContext) -> None:
        charged = ctx.upstream_results.get("charge") or {}
        with ctx.transaction() as conn:
            conn.execute(
                orders.update()
                .where(orders.c.id == order)
                .values(state="complete", charge=charged.get("charge_id"))
            )

    _ = (charge, complete, receipt)
    return queue, mailer, hooks


def place_order(queue: sqlqueue.Queue, mailer: Mailer, hooks: Webhooks, order: int) -> Any:
    """Write the order and its workflow in ONE transaction: both commit, or neither."""
    with queue.engine.begin() as conn:
        conn.execute(orders.insert().values(id=order, state="placed"))
        wf = sqlqueue.Workflow()  # on_dead="wait": a dead step holds the steps after it
        wf.add("charge", sqlqueue.JobRequest(job_type="billing.charge", payload={"order": order}))
        wf.add("receipt", mailer.request(to="ada@example.com", template="receipt",
                                         context={"order": order}), after=["charge"])  # fmt: skip
        wf.add("warehouse", hooks.request(conn, endpoint="warehouse", event_type="order.paid",
                                          data={"order": order}), after=["charge"])  # fmt: skip
        wf.add("complete", sqlqueue.JobRequest(job_type="orders.complete",
                                               payload={"order": order}),
               after=["charge", "receipt", "warehouse"])  # reads the charge's result  # fmt: skip
        return queue.enqueue_workflow(conn, wf)


def run_until_quiet(queue: sqlqueue.Queue, workflow_id: int, *, limit: float = 30.0) -> None:
    """Burst workers until no step of the workflow is queued, running or failed."""
    deadline = time.monotonic() + limit
    busy = {sqlqueue.JobStatus.QUEUED, sqlqueue.JobStatus.RUNNING, sqlqueue.JobStatus.FAILED}
    while True:
        queue.worker(concurrency=4, poll_interval=0.05).run(burst=True)
        status = queue.get_workflow(workflow_id)
        assert status is not None
        if not any(step.status in busy for step in status.steps.values()):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the workflow is still running after {limit:.0f} s")
        time.sleep(0.1)


def show(status: sqlqueue.WorkflowStatus) -> None:
    for name, step in status.steps.items():
        after = f" after {', '.join(step.after)}" if step.after else ""
        print(f"  {name:<10} job {step.job_id:<3} {step.status.value:<9}{after}")


def check(claim: str, holds: bool, failures: list[str]) -> None:
    print(f"  {'ok' if holds else 'UNEXPECTED'}: {claim}")
    if not holds:
        failures.append(claim)


def run(engine: sa.Engine, smtp_port: int, inbox: Inbox, warehouse: Warehouse) -> int:
    sqlqueue.migrate(engine)
    orders.metadata.create_all(engine)
    queue, mailer, hooks = build_queue(engine, smtp_port)
    with engine.begin() as conn:
        warehouse.secret = hooks.add_endpoint(conn, name="warehouse", url=warehouse.url).secret
    failures: list[str] = []

    print("\n== 1. Order 7 is placed: its row and its four-step workflow in one transaction")
    handle = place_order(queue, mailer, hooks, 7)
    show(queue.get_workflow(handle.id))  # type: ignore[arg-type]

    print("\n== 2. Workers run it; the warehouse is down, so its webhook dies")
    run_until_quiet(queue, handle.id)
    status = queue.get_workflow(handle.id)
    assert status is not None
    show(status)
    check("the receipt was emailed", len(inbox.received) == 1, failures)
    check("'complete' waits, blocked by the dead webhook", status.blocked_by == ("warehouse",)
          and status.steps["complete"].status is sqlqueue.JobStatus.WAITING, failures)  # fmt: skip

    print("\n== 3. The warehouse is back; support requeues the dead delivery")
    warehouse.up = True
    command = ["dead", "requeue", "--type", hooks.task.name, "--by", "support@example.com",
               "--reason", "warehouse is back"]  # fmt: skip
    print(f"  $ sqlqueue {' '.join(command)}")
    url = engine.url.render_as_string(hide_password=False)
    environment = {**os.environ, URL_VARIABLE: url}  # not on the command line: no password shown
    done = subprocess.run([sys.executable, "-m", "sqlqueue", *command], capture_output=True,
                          text=True, env=environment, check=False)  # fmt: skip
    print("  " + (done.stdout + done.stderr).strip().replace("\n", "\n  "))
    run_until_quiet(queue, handle.id)
    status = queue.get_workflow(handle.id)
    assert status is not None
    show(status)
    with engine.connect() as conn:
        state, charge = conn.execute(sa.select(orders.c.state, orders.c.charge)).one()
    check("the requeued delivery took the dead one's place and succeeded",
          status.steps["warehouse"].status is sqlqueue.JobStatus.SUCCEEDED, failures)  # fmt: skip
    check("the warehouse received order 7 once", warehouse.orders == [7], failures)
    check("the workflow finished, every step succeeded", status.succeeded, failures)
    check("order 7 is complete with the charge's result", (state, charge) == ("complete", "ch_7"),
          failures)  # fmt: skip
    if failures:
        return 1
    print("\nall checks passed")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", default=os.environ.get(URL_VARIABLE),
                        help="default: an SQLite file in a temporary directory")  # fmt: skip
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="sqlqueue-workflow-"))
    engine = sa.create_engine(args.database_url or f"sqlite:///{workdir / 'orders.db'}")
    print(f"database: {engine.url.render_as_string(hide_password=True)}")
    inbox, warehouse = Inbox(), Warehouse()
    port = _free_port()
    mail = Controller(inbox, hostname="127.0.0.1", port=port)
    mail.start()
    try:
        return run(engine, port, inbox, warehouse)
    finally:
        mail.stop()
        warehouse.server.shutdown()
        engine.dispose()
        shutil.rmtree(workdir, ignore_errors=True)


def _free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (aiosmtpd needs a number)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
