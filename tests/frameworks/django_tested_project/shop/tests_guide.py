from django.db import connection, transaction
from django.test import TestCase
from shop.jobs import queue, ship
from shop.models import Order, Shipment

from sqlqueue.testing import assert_enqueued, drain


class ShippingTests(TestCase):
    def test_an_order_is_shipped(self):
        with transaction.atomic():
            order = Order.objects.create(item="book")
            ship.enqueue(connection, order_id=order.pk)
        assert_enqueued(queue, "ship", {"order_id": order.pk}, count=1)

        result = drain(queue)  # the handlers run here, on the test's database

        assert result.succeeded == 1
        assert Shipment.objects.get().item == "book"
