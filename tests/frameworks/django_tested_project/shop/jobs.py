"""The shop's queue, built when the module is imported (as the guide shows), and its task."""

import sqlqueue.django

from .models import Order, Shipment

queue = sqlqueue.django.queue()


@queue.task("ship")
def ship(order_id: int) -> None:
    """Read the order through the ORM and record its shipment."""
    order = Order.objects.get(pk=order_id)
    Shipment.objects.create(order=order, item=order.item)
