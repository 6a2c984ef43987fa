"""The shop's queue and its tasks: built when the module is imported, used at first need."""

import sqlqueue.django

from .models import Order, Shipment

queue = sqlqueue.django.queue()


@queue.task("ship")
def ship(order_id: int) -> None:
    order = Order.objects.get(pk=order_id)  # the ORM, in the worker process
    Shipment.objects.create(order=order, item=order.item)
