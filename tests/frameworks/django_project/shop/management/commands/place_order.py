"""``manage.py place_order REQUEST ITEM [--fail] [--using ALIAS]``: what the view does, from the
command line; prints what the transaction saw before it ended, as JSON."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connections, transaction
from shop.jobs import queue, ship
from shop.models import Order


class Refused(Exception):
    """The failure asked for with ``--fail``, after the writes."""


class Command(BaseCommand):
    """Place an order and enqueue its shipping, in one ``atomic()`` block."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("request")
        parser.add_argument("item")
        parser.add_argument("--fail", action="store_true")
        parser.add_argument(
            "--autocommit", action="store_true", help="no atomic() block: Django's autocommit"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        seen: dict[str, Any] = {}
        conn = connections["default"]
        if options["autocommit"]:
            order = Order.objects.create(request=options["request"], item=options["item"])
            seen["job"] = ship.enqueue(conn, order_id=order.pk)
            seen["outside"] = queue.get_job(seen["job"]) is not None  # committed at once
            self.stdout.write(json.dumps(seen))
            return
        try:
            with transaction.atomic():
                order = Order.objects.create(request=options["request"], item=options["item"])
                seen["job"] = ship.enqueue(conn, order_id=order.pk)
                # The job row is in this transaction: Django's connection sees it, a
                # connection of the queue's own engine does not, yet.
                with conn.cursor() as cursor:
                    cursor.execute(
                        "SELECT COUNT(*) FROM sqlqueue_jobs WHERE id = %s", [seen["job"]]
                    )
                    seen["inside"] = cursor.fetchone()[0]
                seen["outside"] = queue.get_job(seen["job"]) is not None
                if options["fail"]:
                    raise Refused
        except Refused:
            seen["rolled_back"] = True
        self.stdout.write(json.dumps(seen))
