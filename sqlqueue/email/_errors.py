"""The email kind's errors, placed in sqlqueue's one hierarchy::

    SqlqueueError
    ├── EnqueueError
    │   └── EmailInputError           Mailer.send was given something it cannot send; no row written
    │       ├── UnknownTemplate       no template of that name on this Mailer
    │       └── InvalidAddress        a recipient or sender is not one valid email address
    └── HandlerSignal
        ├── Retry
        │   └── SMTPTemporaryError    4xx reply, lost connection, timeout: retried with the backoff
        └── PermanentError
            ├── SMTPPermanentError    5xx reply: dead at once, code and text in last_error
            ├── TemplateChanged       the template's version moved and on_template_change="fail"
            └── UnsafeHeader          a rendered header holds a line break or control
                                      character (decoded), or a stored address is not one
                                      send() takes: never sent

The signals are what the email task raises so that the worker does the right thing; an app sees
them as the ``kind`` of a job's errors, and in its ``last_error``.
"""

from __future__ import annotations

from sqlqueue import EnqueueError, PermanentError, Retry

__all__ = [
    "EmailInputError",
    "InvalidAddress",
    "SMTPPermanentError",
    "SMTPTemporaryError",
    "TemplateChanged",
    "UnknownTemplate",
    "UnsafeHeader",
]


class EmailInputError(EnqueueError, ValueError):
    """``Mailer.send`` was given input it cannot send; nothing was written."""


class UnknownTemplate(EmailInputError, LookupError):
    """No template of that name is registered on the Mailer."""


class InvalidAddress(EmailInputError):
    """A recipient or the sender is not exactly one valid mailbox (not a list, not a group),
    or holds what a reader would misread: a control character, or an encoded word that
    decodes to address syntax or to another encoded word."""


class SMTPTemporaryError(Retry):
    """The server answered 4xx, the connection failed or dropped, or the attempt timed out:
    another attempt may succeed, after the task's backoff. ``code`` is ``None`` without a reply."""

    def __init__(self, reason: str, *, code: int | None = None) -> None:
        super().__init__(None, reason)
        self.code = code


class SMTPPermanentError(PermanentError):
    """The server answered 5xx (or cannot do what the message needs): retrying cannot help."""

    def __init__(self, reason: str, *, code: int | None = None) -> None:
        super().__init__(reason)
        self.code = code


class TemplateChanged(PermanentError):
    """The job's template changed version since it was enqueued, and the Mailer was told
    ``on_template_change="fail"``."""


class UnsafeHeader(PermanentError):
    """A header of the message (a template's rendered subject, an address) holds a line break
    or another control character, as written or once its RFC 2047 encoded words are decoded;
    an address stored in the job is not one ``Mailer.send`` takes (a row written around it);
    or the generated message's headers are not the ones it was given, or a line of it is
    longer than 998 bytes: the message is not sent, and retrying cannot help.
    Subjects and addresses given to ``Mailer.send`` are refused there (:class:`EmailInputError`,
    :class:`InvalidAddress`); this is for what only an attempt renders."""
