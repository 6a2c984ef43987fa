"""Webhooks as a built-in job kind: signed deliveries to partner endpoints, retried only when
the receiver can recover, never sent twice by sqlqueue's own doing, one endpoint unable to slow
the others. Sending needs the extra ``pip install 'sqlalchemy-sqlqueue[webhooks]'`` (httpx);
receivers can import :func:`verify` without it::

    from sqlqueue.webhooks import Webhooks, verify, WebhookVerificationError

    hooks = Webhooks(queue)                                   # registers the delivery task
    with engine.begin() as conn:
        hooks.add_endpoint(conn, name="crm", url="https://crm.example.com/hooks")
    with engine.begin() as conn:                              # in the app's own transaction
        hooks.deliver(conn, endpoint="crm", event_type="user.created", data={"user_id": 1},
                      idempotency_key="crm:user:1:created")

    payload = verify(secret, request.headers, request.body)  # on the receiving side

Messages follow the Standard Webhooks scheme (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``), so receivers may verify with any Standard Webhooks library. Errors::

    SqlqueueError
    └── WebhookError
        ├── UnknownEndpoint, WebhookVerificationError
        ├── DeliveryFailed    (a sqlqueue.Retry)           retried
        └── DeliveryRejected, DeliveryRefused (sqlqueue.PermanentError)   dead
"""

from sqlqueue.webhooks._endpoints import Endpoint
from sqlqueue.webhooks._errors import (
    DeliveryFailed,
    DeliveryRefused,
    DeliveryRejected,
    UnknownEndpoint,
    WebhookError,
    WebhookVerificationError,
)
from sqlqueue.webhooks._signing import generate_secret, verify
from sqlqueue.webhooks._webhooks import TASK_NAME, Webhooks

__all__ = [
    "TASK_NAME",
    "DeliveryFailed",
    "DeliveryRefused",
    "DeliveryRejected",
    "Endpoint",
    "UnknownEndpoint",
    "WebhookError",
    "WebhookVerificationError",
    "Webhooks",
    "generate_secret",
    "verify",
]
