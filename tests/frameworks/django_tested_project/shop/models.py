"""An order, and its shipment (written by the job, through the ORM)."""

from django.db import models


class Order(models.Model):
    """A customer's order."""

    item = models.CharField(max_length=100)


class Shipment(models.Model):
    """One run of the shipping job for an order."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    item = models.CharField(max_length=100)
