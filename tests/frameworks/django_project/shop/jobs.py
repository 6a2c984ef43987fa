"""The shop's queue, on Django's default database, and its one task."""

import sqlqueue.django

from .models import Order, Shipment

queue = sqlqueue.django.queue(lease_seconds=30)


@queue.task("ship")
def ship(order_id: int) -> None:
    """Read the order through the ORM and record its shipment."""
    order = Order.objects.get(pk=order_id)
    Shipment.objects.create(order=order, item=order.item)
