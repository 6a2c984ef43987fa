"""One SMTP exchange with aiosmtplib, and the one function that turns what the server said
into what the job does next.

what happened                                            the job
-------------------------------------------------------  ----------------------------------------
250 for every recipient                                  succeeded
250 for some, 5xx for the others                         succeeded; the refused are in the result
250 for some, 4xx for others (451, 452 …)                succeeded for the accepted; the 4xx-
                                                         refused are deferred: a follow-up job,
                                                         enqueued with the success, sends them
                                                         the same message (``_mailer``)
4xx (421, 450, 451, 452 …) to a command or every RCPT    SMTPTemporaryError: retried (backoff)
connection refused or dropped, TLS failure, timeout      SMTPTemporaryError: retried (backoff)
5xx (550, 553, 554 …) to a command or every RCPT         SMTPPermanentError: dead at once
the server lacks the STARTTLS or AUTH the config asks    SMTPPermanentError: dead at once
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiosmtplib

from sqlqueue import HandlerSignal
from sqlqueue.email._config import SMTP
from sqlqueue.email._connections import ConnectionPool
from sqlqueue.email._errors import SMTPPermanentError, SMTPTemporaryError
from sqlqueue.email._message import OutgoingMessage
from sqlqueue.email._wire import send

__all__ = ["Delivery", "deliver", "explain"]

log = logging.getLogger("sqlqueue.email")

#: The most a polite QUIT after a delivered message may take.
_QUIT_SECONDS = 5.0


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """What the server said to one message: its final reply to the data, the recipients it took,
    and those it refused with its reply to each (``"550 5.1.1 no such user"``).

    ``deferred`` are the refused whose reply was a 4xx ("try again later", e.g. ``452 Too many
    recipients``), in the order they were given: they are refused for this exchange only and
    are to be sent the message again. The others (5xx) are refused for good."""

    reply: str
    accepted: list[str]
    refused: dict[str, str]
    deferred: list[str] = field(default_factory=list)


async def deliver(
    smtp: SMTP,
    message: OutgoingMessage,
    *,
    sender: str,
    recipients: Sequence[str],
    pool: ConnectionPool | None = None,
) -> Delivery:
    """Send ``message`` within ``smtp.timeout`` for the whole exchange, over a connection kept
    in ``pool`` or a new one.

    Raises :class:`SMTPTemporaryError` or :class:`SMTPPermanentError` (see the table above);
    the password is given to aiosmtplib and to nothing else.
    """
    client: aiosmtplib.SMTP | None = None
    try:
        async with asyncio.timeout(smtp.timeout):
            client = await _kept(pool)
            if client is not None:
                try:
                    refused, reply = await send(client, message, sender, recipients)
                except (aiosmtplib.SMTPServerDisconnected, ConnectionError):
                    # The kept connection answered NOOP, then the server closed it (its idle
                    # timer ran out meanwhile on a stalled loop): send on a new one, as the
                    # next attempt would, without spending an attempt on a stale socket.
                    client.close()
                    client = None
            if client is None:
                client = await _connect(smtp)
                refused, reply = await send(client, message, sender, recipients)
    except TimeoutError as error:  # aiosmtplib's own timeouts are TimeoutErrors too
        if client is not None:
            client.close()
        raise SMTPTemporaryError(
            f"{_where(smtp)}: no answer within {smtp.timeout:g} s ({_text(error)})"
        ) from None
    except Exception as error:
        if client is not None:
            client.close()
        raise explain(error, smtp) from None
    except BaseException:  # cancelled (the worker stops): the job is released; close the socket
        if client is not None:
            client.close()
        raise
    if pool is None or not pool.give_back(client):
        await _say_goodbye(client, smtp.timeout)
    refused_replies = {
        address: f"{answer.code} {answer.message}" for address, answer in refused.items()
    }
    accepted = [address for address in recipients if address not in refused]
    # aiosmtplib raises only when every recipient is refused; a partial refusal comes back here.
    # A 4xx to RCPT means "not now" (452 too many recipients, 451 local error, 450 busy mailbox):
    # those recipients did not get the message and must be tried again.
    deferred = [
        address
        for address in recipients
        if address in refused and 400 <= refused[address].code < 500
    ]
    # aiosmtplib returns the text of the reply to the data; its code can only be 250 (any other
    # raised SMTPDataError above), so it is put back: the reply as the server sent it.
    return Delivery(
        reply=f"250 {reply}", accepted=accepted, refused=refused_replies, deferred=deferred
    )


async def _connect(smtp: SMTP) -> aiosmtplib.SMTP:
    """A new connection, with STARTTLS and AUTH as configured."""
    client = aiosmtplib.SMTP(
        hostname=smtp.host,
        port=smtp.port,
        username=smtp.username,
        password=smtp.password,
        use_tls=smtp.use_tls,
        start_tls=smtp.starttls,
        timeout=smtp.timeout,
        tls_context=smtp.tls_context,
    )
    await client.connect()
    return client


async def _kept(pool: ConnectionPool | None) -> aiosmtplib.SMTP | None:
    """A kept connection that still answers NOOP, or ``None`` (then the caller connects)."""
    while pool is not None and (client := pool.take()) is not None:
        try:
            await client.noop()
        except Exception:  # closed by the server while idle: try the next one, or a new one
            client.close()
            continue
        return client
    return None


async def _say_goodbye(client: aiosmtplib.SMTP, timeout: float) -> None:
    """QUIT politely, then close. The server has accepted the message by now, so nothing here
    may fail the attempt: a retry would send the message again."""
    try:
        async with asyncio.timeout(min(timeout, _QUIT_SECONDS)):
            await client.quit()
    except Exception:  # a server that hangs up or stalls after 250 has the message anyway
        log.debug("QUIT after a delivered message failed; closing", exc_info=True)
    finally:
        client.close()


def explain(error: Exception, smtp: SMTP) -> HandlerSignal | Exception:
    """The signal for an error of one exchange; an error that is not about SMTP or the network
    is returned as it is (the worker retries it like any handler error)."""
    where = _where(smtp)
    if isinstance(error, aiosmtplib.SMTPRecipientsRefused):
        # Every recipient refused: nobody got the message, so trying again resends to no one.
        codes = [refusal.code for refusal in error.recipients]
        detail = "; ".join(f"{r.recipient}: {r.code} {r.message}" for r in error.recipients)
        reason = f"{where} refused every recipient: {detail}"
        if all(code >= 500 for code in codes):
            return SMTPPermanentError(reason, code=codes[0])
        return SMTPTemporaryError(reason, code=min(codes))
    if isinstance(error, aiosmtplib.SMTPResponseException):
        reason = f"{where} answered {error.code} {error.message}"
        if isinstance(error, aiosmtplib.SMTPSenderRefused):
            reason = f"{where} refused the sender {error.sender}: {error.code} {error.message}"
        if 500 <= error.code < 600:
            return SMTPPermanentError(reason, code=error.code)
        return SMTPTemporaryError(reason, code=error.code)
    if isinstance(error, aiosmtplib.SMTPNotSupported) or type(error) is aiosmtplib.SMTPException:
        # aiosmtplib raises its base class itself when the server lacks what the settings ask
        # for (STARTTLS, AUTH, a usable AUTH mechanism): no retry makes the server grow it.
        return SMTPPermanentError(f"{where}: {_text(error)}; check the Mailer's SMTP settings")
    if isinstance(error, aiosmtplib.SMTPException | OSError):  # refused, dropped, TLS failures
        return SMTPTemporaryError(f"{where}: {type(error).__name__}: {_text(error)}")
    return error


def _where(smtp: SMTP) -> str:
    return f"SMTP server {smtp.host}:{smtp.port}"


def _text(error: BaseException) -> str:
    return str(error) or type(error).__name__
