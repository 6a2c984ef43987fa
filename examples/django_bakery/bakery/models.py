"""An order; ``baked`` is set by its job."""

from django.db import models


class Order(models.Model):
    """A customer's order of one cake."""

    cake = models.CharField(max_length=100)
    baked = models.BooleanField(default=False)
