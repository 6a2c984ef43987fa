"""The shop's view: an order and its shipping job, committed together or not at all."""

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse

from .jobs import ship
from .models import Order


def place_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        ship.enqueue(connection, order_id=order.pk)  # commits with the order, or not at all
    return JsonResponse({"order": order.pk}, status=201)
