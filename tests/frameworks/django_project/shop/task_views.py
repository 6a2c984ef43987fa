"""The shop's views on Django's Tasks framework: nothing here imports sqlqueue."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from .models import Order
from .tasks import ship_order


def place_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        result = ship_order.enqueue(order.pk)  # commits with the order, or not at all
    return JsonResponse({"shipping": result.id}, status=201)


def shipping(request: HttpRequest, result_id: str) -> JsonResponse:
    result = ship_order.get_result(result_id)  # or result.refresh() on one you hold
    return JsonResponse({"status": result.status})  # READY, RUNNING, SUCCESSFUL, FAILED
