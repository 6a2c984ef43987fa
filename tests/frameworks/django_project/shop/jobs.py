"""The shop's queue, on Django's default database, and its tasks."""

from django.db import connection

import sqlqueue.django

from .models import Order, Session, Shipment

queue = sqlqueue.django.queue(lease_seconds=30)


@queue.task("ship")
def ship(order_id: int) -> None:
    """Read the order through the ORM and record its shipment."""
    order = Order.objects.get(pk=order_id)
    Shipment.objects.create(order=order, item=order.item)


@queue.task("note_session")
def note_session(label: str) -> None:
    """Record the server session of this handler thread's Django connection."""
    query = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
    with connection.cursor() as cursor:
        cursor.execute(query[connection.vendor])
        (session,) = cursor.fetchone()
    Session.objects.create(label=label, session=session)
