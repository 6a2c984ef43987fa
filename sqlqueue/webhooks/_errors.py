"""The errors of the webhook kind, under sqlqueue's one hierarchy::

    SqlqueueError
    └── WebhookError                  anything the webhook kind raises
        ├── UnknownEndpoint           no endpoint of that name (LookupError)
        ├── WebhookVerificationError  a receiver's check failed: bad signature, stale timestamp
        ├── DeliveryFailed            (also a sqlqueue.Retry) the attempt may succeed later:
        │                             5xx, 408, 429, timeout, connection error
        ├── DeliveryRejected          (also a sqlqueue.PermanentError) the receiver said no:
        │                             4xx, 410 Gone, a redirect
        └── DeliveryRefused           (also a sqlqueue.PermanentError) sqlqueue would not send:
                                      a disabled endpoint, a forbidden address

The last three are what a delivery job's handler raises; their names are the ``kind`` of the
entries in the job's error history, and ``last_error`` reads ``DeliveryFailed: 503 Service
Unavailable from crm.example.com after 10.0 s``.
"""

from __future__ import annotations

from sqlqueue import PermanentError, Retry, SqlqueueError

__all__ = [
    "DeliveryFailed",
    "DeliveryRefused",
    "DeliveryRejected",
    "UnknownEndpoint",
    "WebhookError",
    "WebhookVerificationError",
]


class WebhookError(SqlqueueError):
    """Root of the errors of the webhook kind."""


class UnknownEndpoint(WebhookError, LookupError):
    """No webhook endpoint has that name: add it with ``Webhooks.add_endpoint`` first."""


class WebhookVerificationError(WebhookError, ValueError):
    """A received webhook is not authentic or not fresh; answer 400 and do not process it."""


class DeliveryFailed(Retry, WebhookError):
    """An attempt that may succeed later: it is retried with the backoff (or ``Retry-After``)."""


class DeliveryRejected(PermanentError, WebhookError):
    """The receiver refused the delivery in a way retrying cannot fix: the job goes dead."""


class DeliveryRefused(PermanentError, WebhookError):
    """sqlqueue refused to send (disabled endpoint, forbidden address): the job goes dead."""
