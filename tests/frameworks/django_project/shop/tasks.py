"""The shop's background work, written for Django's Tasks framework alone."""

from django_tasks import task  # Django >= 6.0: from django.tasks import task

from .models import Order, Shipment


@task(priority=10, queue_name="shipping")
def ship_order(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    Shipment.objects.create(order=order, item=order.item)
    return f"shipped {order.item}"
