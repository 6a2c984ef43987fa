"""``manage.py demo``: the whole story, from migrations to a baked order."""

import subprocess
import sys
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection, transaction

from bakery.jobs import bake, queue
from bakery.models import Order


class Changed(Exception):
    """The customer changed their mind, after the order and its job were written."""


class Command(BaseCommand):
    """Place two orders (one rolled back), run a worker, show what was baked."""

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("sqlqueue_migrate")
        call_command("migrate", run_syncdb=True, verbosity=0)
        with transaction.atomic():
            kept = Order.objects.create(cake="lemon tart")
            bake.enqueue(connection, order_id=kept.pk)
        try:
            with transaction.atomic():
                dropped = Order.objects.create(cake="opera")
                bake.enqueue(connection, order_id=dropped.pk)
                raise Changed
        except Changed:
            self.stdout.write("the second order rolled back, and its job with it")
        subprocess.run(
            [sys.executable, sys.argv[0], "sqlqueue_worker", "bakery.jobs:queue", "--burst"],
            check=True,
        )
        baked = list(Order.objects.values_list("cake", "baked"))
        self.stdout.write(f"orders: {baked}; jobs: {queue.stats().by_status}")
