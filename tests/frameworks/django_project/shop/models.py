"""An order, and the record of its shipping (written by the job, through the ORM)."""

from django.db import models


class Order(models.Model):
    """A customer's order; ``request`` is the id the client gave it (for counting)."""

    request = models.CharField(max_length=64, unique=True)
    item = models.CharField(max_length=100)


class Shipment(models.Model):
    """One run of the shipping job for an order: a job run twice shows as two rows."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    item = models.CharField(max_length=100)


class Session(models.Model):
    """The server session a handler's Django connection had, by the job's label."""

    label = models.CharField(max_length=64, unique=True)
    session = models.BigIntegerField()
