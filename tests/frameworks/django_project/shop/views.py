"""``POST /orders/``: the order and its job in one ``atomic()`` block; ``fail=1`` raises after
both are written, so the block rolls back and neither may remain."""

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .jobs import ship
from .models import Order


class Refused(Exception):
    """The failure a request asks for, after its writes."""


@csrf_exempt
def place_order(request: HttpRequest) -> HttpResponse:
    """Place the order ``request`` (the client's id) for ``item``; roll back with ``fail``."""
    try:
        with transaction.atomic():
            order = Order.objects.create(request=request.POST["request"], item=request.POST["item"])
            job_id = ship.enqueue(connection, order_id=order.pk)
            if request.POST.get("fail"):
                raise Refused(order.pk)
    except Refused:
        return JsonResponse({"rolled_back": True}, status=409)
    return JsonResponse({"order": order.pk, "job": job_id}, status=201)
