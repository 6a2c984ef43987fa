"""The bakery's queue, on Django's default database, and its task."""

import sqlqueue.django

from .models import Order

queue = sqlqueue.django.queue()


@queue.task("bake")
def bake(order_id: int) -> None:
    """Bake the order: read it through the ORM, mark it baked."""
    order = Order.objects.get(pk=order_id)
    order.baked = True
    order.save(update_fields=["baked"])
