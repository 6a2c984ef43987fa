"""The shop's own tests, as a Django user writes them: the tasks module imported at the top
(before the test runner makes the test database), Django's ``TestCase`` and
``TransactionTestCase`` with the default test settings, sqlqueue's testing helpers."""

import contextlib
import io
import json
import sqlite3
import tempfile
import warnings
from pathlib import Path

from django.core.management import call_command
from django.db import connection, transaction
from django.test import (
    RequestFactory,
    SimpleTestCase,
    TestCase,
    TransactionTestCase,
    override_settings,
)
from shop.jobs import queue, ship
from shop.models import Order, Shipment
from shop.views import place_order

import sqlqueue
from sqlqueue.testing import assert_enqueued, drain


class Refused(Exception):
    """A failure after the writes, which rolls the block back."""


def place(item: str) -> Order:
    """An order placed through the shop's view (the order and its shipping job in one
    ``atomic()`` block), as a POST would."""
    response = place_order(RequestFactory().post("/orders/", {"item": item}))
    assert response.status_code == 201, response.content
    return Order.objects.get(pk=json.loads(response.content)["order"])


class Shipping:
    """The same tests in either kind of test case."""

    def test_a_rolled_back_order_leaves_no_job(self) -> None:
        with contextlib.suppress(Refused), transaction.atomic():
            order = Order.objects.create(item="pen")
            ship.enqueue(connection, order_id=order.pk)
            raise Refused
        assert_enqueued(queue, "ship", {"order_id": order.pk}, count=0)
        assert drain(queue).ran == 0

    def test_an_order_is_shipped_by_its_job(self) -> None:
        order = place("book")
        assert_enqueued(queue, "ship", {"order_id": order.pk}, count=1)
        assert not Shipment.objects.exists()
        result = drain(queue)
        assert (result.succeeded, result.failed, result.dead) == (1, 0, 0), result
        # The handler read the order and wrote the shipment through the ORM, in this database.
        assert list(Shipment.objects.values_list("order_id", "item")) == [(order.pk, "book")]
        assert_enqueued(queue, "ship", {"order_id": order.pk}, count=1)
        (job,) = [job for job in queue.jobs() if job.payload == {"order_id": order.pk}]
        assert job.status == "succeeded", job

    def test_sqlqueue_migrate_in_a_test_finds_the_tables_made(self) -> None:
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            call_command("sqlqueue_migrate", stdout=said)
        assert "sqlqueue: already up to date at revision" in said.getvalue(), said.getvalue()
        queue.jobs()  # the tables are there, and the test's connection still works

    def test_the_queue_is_on_the_test_database(self) -> None:
        assert queue.engine.url.database == connection.settings_dict["NAME"]


class ShippingInATestCase(Shipping, TestCase):
    """Each test in a transaction that Django rolls back: the jobs go with it."""

    def test_zz_the_jobs_of_earlier_tests_were_rolled_back_with_them(self) -> None:
        assert queue.jobs() == []


class ShippingInATransactionTestCase(Shipping, TransactionTestCase):
    """Each test commits, as the app does in production."""


class OverriddenDatabases(SimpleTestCase):
    """``override_settings(DATABASES=…)`` moves the queue, though not Django's connections."""

    def test_the_queue_follows_an_overridden_database_and_comes_back(self) -> None:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "elsewhere.db"
            sqlqueue.migrate(f"sqlite:///{path}")
            elsewhere = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Django's "can lead to unexpected behavior"
                with override_settings(DATABASES=elsewhere):
                    assert queue.engine.url.database == str(path)
                    with queue.engine.begin() as conn:
                        ship.enqueue(conn, order_id=7)
                    assert [job.payload for job in queue.jobs()] == [{"order_id": 7}]
            with contextlib.closing(sqlite3.connect(path)) as elsewhere_db:
                stored = elsewhere_db.execute("SELECT payload FROM sqlqueue_jobs").fetchall()
            assert [row[0].replace(" ", "") for row in stored] == ['{"order_id":7}']
        # Back on the test database, which holds no such job.
        assert queue.engine.url.database == connection.settings_dict["NAME"]
