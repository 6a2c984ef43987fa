"""``manage.py tasks_demo [--worker ARG …]``: the shop on Django's Tasks framework, from the
command line. It enqueues tasks as views would (in ``atomic()`` blocks, one rolled back), runs
``manage.py sqlqueue_worker [ARG …] --burst`` in a process of its own, reads every result back
with ``refresh()`` and ``get_result()``, and prints what it saw as JSON."""

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction
from django.test import RequestFactory
from django.utils import timezone
from django_tasks import TaskResult, task
from django_tasks.exceptions import (
    InvalidTaskBackendError,
    InvalidTaskError,
    TaskResultDoesNotExist,
)
from shop.models import Order
from shop.task_probes import anonymous, double, introduce, refuse, stamp, tick
from shop.task_views import place_order, shipping
from shop.tasks import ship_order

from sqlqueue.django.tasks import Backend

PROJECT = Path(__file__).resolve().parents[3]
#: One job at a time, so the order they ran in is the order they were claimed in.
BURST = ["--concurrency", "1", "--burst"]


class Refused(Exception):
    """The failure that rolls the first order back."""


def described(result: TaskResult[Any]) -> dict[str, Any]:
    """What the suite checks of a result, as JSON."""
    return {
        "id": result.id,
        "status": str(result.status),
        "return": result.return_value if result.status == "SUCCESSFUL" else None,
        "errors": [
            {"class": error.exception_class_path, "traceback": error.traceback}
            for error in result.errors
        ],
        "enqueued_at": result.enqueued_at and result.enqueued_at.isoformat(),
        "started_at": result.started_at and result.started_at.isoformat(),
        "finished_at": result.finished_at and result.finished_at.isoformat(),
        "attempts": result.attempts,
        "task": result.task.module_path,
        "priority": result.task.priority,
        "queue": result.task.queue_name,
        "run_after": result.task.run_after and result.task.run_after.isoformat(),
        "args": result.args,
        "kwargs": result.kwargs,
    }


def view_status(result_id: str) -> str:
    """The status the guide's ``shipping`` view answers for ``result_id``."""
    answer = shipping(RequestFactory().get(f"/shipping/{result_id}/"), result_id)
    status: str = json.loads(answer.content)["status"]
    return status


def refusal(call: Any) -> str:
    """The message of the ``InvalidTaskError`` that ``call()`` raises."""
    try:
        call()
    except InvalidTaskError as error:
        return str(error)
    raise AssertionError("not refused")


def misconfigured(options: dict[str, Any]) -> str:
    """What sqlqueue's backend says of ``OPTIONS`` it cannot use."""
    try:
        Backend("wrong", {"OPTIONS": options})
    except InvalidTaskBackendError as error:
        return str(error)
    raise AssertionError("not refused")


def nested() -> None:
    @task()
    def inner() -> None:
        """A task that is no module's attribute."""


class Command(BaseCommand):
    """Enqueue, run a worker, read the results (see the module)."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker", action="append", default=[], help="sqlqueue_worker's")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", run_syncdb=True, verbosity=0)
        seen: dict[str, Any] = {}
        try:
            with transaction.atomic():
                order = Order.objects.create(request="rolled-back", item="pen")
                gone = ship_order.enqueue(order.pk)
                with connection.cursor() as cursor:
                    cursor.execute("SELECT COUNT(*) FROM sqlqueue_jobs WHERE id = %s", [gone.id])
                    seen["inside"] = cursor.fetchone()[0]
                raise Refused
        except Refused:
            seen["rolled_back"] = gone.id
        with transaction.atomic():
            order = Order.objects.create(request="kept", item="book")
            shipped = ship_order.enqueue(order.pk)
        seen["enqueued"] = described(shipped)
        # The guide's views: a POST places an order and enqueues its task; a GET reads it.
        placed = place_order(RequestFactory().post("/orders/", {"item": "lamp"}))
        by_view = json.loads(placed.content)["shipping"]
        seen["view"] = {"placed": placed.status_code, "id": by_view, "before": view_status(by_view)}
        seen["read_before_the_worker"] = described(ship_order.get_result(shipped.id))
        later_at = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
        results = {
            "shipped": shipped,
            "low": stamp.using(priority=-10).enqueue("low"),
            "plain": stamp.enqueue("plain"),
            "high": stamp.using(priority=10).enqueue("high"),
            "later": stamp.using(run_after=later_at).enqueue("later"),
            "refused": refuse.enqueue("out of stock"),
            "doubled": double.enqueue(21),
            "introduced": introduce.enqueue(greeting="hello"),
        }
        seen["later_at"] = later_at.isoformat()
        seen["tick"] = tick.enqueue(connection)
        seen["lambda"] = refusal(anonymous.enqueue)
        seen["nested"] = refusal(nested)
        # What the backport's base backend refuses before anything is written.
        seen["unknown_queue"] = refusal(lambda: stamp.using(queue_name="nowhere").enqueue("x"))
        naive = datetime(2030, 1, 1)  # no tzinfo: the mistake under test
        seen["naive_run_after"] = refusal(lambda: stamp.using(run_after=naive).enqueue("x"))
        try:
            stamp.enqueue(object())
        except (TypeError, ValueError) as error:
            seen["not_json"] = f"{type(error).__name__}: {error}"
        wrong: list[dict[str, Any]] = [
            {"DATABSE": "default"},
            {"MAX_ATTEMPTS": 0},
            {"DATABASE": "nope"},
        ]
        seen["misconfigured"] = [misconfigured(options) for options in wrong]
        seen["missing"] = []
        for unknown in ["999999999", "no-such-id", "1" * 30, str(seen["tick"])]:
            try:
                stamp.get_backend().get_result(unknown)
            except TaskResultDoesNotExist:
                seen["missing"].append(unknown)
        worker = subprocess.run(
            [sys.executable, "manage.py", "sqlqueue_worker", *options["worker"], *BURST],
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        seen["worker"] = {
            "status": worker.returncode,
            "output": worker.stderr[-4000:],
            "warnings": [line for line in worker.stderr.splitlines() if "WARNING" in line],
        }
        seen["view"]["after"] = view_status(by_view)
        for result in results.values():
            result.refresh()
        seen["results"] = {name: described(result) for name, result in results.items()}
        seen["refreshed_is_read"] = {
            name: result == result.task.get_result(result.id) for name, result in results.items()
        }
        self.stdout.write(json.dumps(seen))
