"""``Mailer``: email as an ordinary sqlqueue task, with templates, a ledger and SMTP's error
classes.

``send`` checks everything it can (addresses, template, its arguments, content), mints the
Message-ID and enqueues one job in the caller's transaction. Each attempt of that job then:

1. looks its key (the dedup key, or else the Message-ID) up in the ledger, and if it is there,
   succeeds without sending: the message went out before, under this key;
2. renders the template (the version registered now; see ``on_template_change``) and builds the
   message with the Message-ID minted at enqueue, the same on every attempt;
3. sends it over one SMTP connection within ``SMTP.timeout`` (see :mod:`._smtp` for what each
   reply does to the job);
4. writes the ledger entry through ``ctx.transaction_async()``, so it commits together with the
   job's success. The one window left: the server accepted and the worker died before that
   commit. The next attempt sends again, with the same Message-ID, which lets receivers drop it.
5. when the server took some recipients and answered others with a 4xx ("try again later", as
   ``452 Too many recipients``), enqueues in that same transaction a follow-up job that sends
   the same message (same Message-ID, headers and template version or content) to those
   recipients only, after the task's first backoff step. Its dedup key is derived from this
   message's key and the deferred recipients, so if this success path runs again for them, it
   finds the follow-up there and makes no second one. Retrying *this* job instead would resend
   to those who accepted. Recipients refused with a 5xx are never sent again.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from sqlqueue import (
    Backoff,
    CircuitBreaker,
    ConfigurationError,
    JobContext,
    PermanentError,
    Queue,
    RateLimit,
    Task,
)
from sqlqueue._task import (
    DEFAULT_MAX_ATTEMPTS,  # the same default as any task's
    JobRequest,
)
from sqlqueue.email._config import SMTP, Content
from sqlqueue.email._connections import ConnectionPool
from sqlqueue.email._errors import (
    EmailInputError,
    TemplateChanged,
    UnknownTemplate,
    UnsafeHeader,
)
from sqlqueue.email._headers import flatten
from sqlqueue.email._ledger import find_sent, record_sent
from sqlqueue.email._message import (
    build_message,
    check_address,
    check_recipients,
    content_hash,
    envelope_address,
    mint_message_id,
)
from sqlqueue.email._smtp import deliver

__all__ = ["Mailer", "TemplateChangePolicy"]

#: What an attempt does when its template's version changed since the job was enqueued:
#: ``"render_new"`` renders the version registered now (and says so in the result);
#: ``"fail"`` sends the job to dead with :class:`TemplateChanged`.
TemplateChangePolicy = Literal["render_new", "fail"]

Render = Callable[..., Any]


@dataclass(frozen=True, kw_only=True)
class _Template:
    name: str
    version: str
    render: Render
    signature: inspect.Signature


class Mailer:
    """Sends email through ``smtp`` as jobs of one task (``name``) on ``jobs``, the app's Queue.

    ``sender`` is the From address. ``queue``, ``priority``, ``max_attempts`` and ``backoff``
    are the task's, as for any task. ``rate_limit`` and ``circuit_breaker`` gate every attempt
    across all workers; without a ``key`` of their own they are keyed by the SMTP provider
    (``smtp:host:port``), so Mailers sharing a provider share its limit. ``on_template_change``
    decides what a job does whose template changed version since it was enqueued.

    ``secret_fields`` names entries of a template's ``context`` (dotted paths, e.g. ``token``
    or ``user.reset_token``) that must not rest in clear: they are encrypted in the job's row
    with the Queue's ``encryption_keys``, decrypted only for the template, and shown as
    ``***`` everywhere else, as a task's ``secret_fields`` are (see the secrets guide).
    """

    def __init__(
        self,
        jobs: Queue,
        /,
        *,
        smtp: SMTP,
        sender: str,
        name: str = "email",
        queue: str = "mail",
        priority: int = 0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff | Sequence[float] | None = None,
        rate_limit: RateLimit | None = None,
        circuit_breaker: CircuitBreaker | None = None,
        on_template_change: TemplateChangePolicy = "render_new",
        secret_fields: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(jobs, Queue):
            raise ConfigurationError(f"Mailer needs a sqlqueue.Queue first, got {jobs!r}")
        if not isinstance(smtp, SMTP):
            raise ConfigurationError(f"smtp must be a sqlqueue.email.SMTP, got {smtp!r}")
        if on_template_change not in ("render_new", "fail"):
            raise ConfigurationError(
                f"on_template_change must be 'render_new' or 'fail', got {on_template_change!r}"
            )
        try:
            self.sender = check_address(sender, "sender")
        except EmailInputError as error:
            raise ConfigurationError(str(error)) from None
        # Anything else is refused, with its field named, when the task is built below.
        if isinstance(rate_limit, RateLimit) and rate_limit.key is None:
            rate_limit = replace(rate_limit, key=smtp.provider)
        if isinstance(circuit_breaker, CircuitBreaker) and circuit_breaker.key is None:
            circuit_breaker = replace(circuit_breaker, key=smtp.provider)
        self.smtp = smtp
        self._pool = (
            ConnectionPool(size=smtp.pool_size, idle_seconds=smtp.pool_idle_seconds)
            if smtp.pool_size
            else None
        )
        self.on_template_change: TemplateChangePolicy = on_template_change
        self._templates: dict[str, _Template] = {}
        self.task: Task = jobs.task(
            name,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            backoff=backoff,
            rate_limit=rate_limit,
            circuit_breaker=circuit_breaker,
            secret_fields=_context_paths(secret_fields),
        )(self._deliver)

    def __repr__(self) -> str:
        return f"Mailer({self.task.name!r}, smtp={self.smtp!r}, sender={self.sender!r})"

    # -- templates ----------------------------------------------------------------------------

    def template(self, name: str, *, version: str = "1") -> Callable[[Render], Render]:
        """Register the decorated function as template ``name`` at ``version``.

        It takes the ``context`` given to :meth:`send` as keyword arguments and returns a
        :class:`Content` (it may be ``async``). Bump ``version`` when what it renders changes:
        jobs record the version they were enqueued for, and ``on_template_change`` decides.
        """
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"template name must be non-empty text, got {name!r}")
        if not isinstance(version, str) or not version:
            raise ConfigurationError(f"template {name!r}: version must be non-empty text")

        def register(render: Render) -> Render:
            if name in self._templates:
                raise ConfigurationError(f"a template named {name!r} is already registered")
            if not callable(render):
                raise ConfigurationError(f"template {name!r} must be callable, got {render!r}")
            self._templates[name] = _Template(
                name=name, version=version, render=render, signature=inspect.signature(render)
            )
            return render

        return register

    @property
    def templates(self) -> Mapping[str, str]:
        """The registered templates' names and versions."""
        return {name: template.version for name, template in self._templates.items()}

    # -- sending ------------------------------------------------------------------------------

    def send(
        self,
        conn: Any,
        /,
        *,
        to: str | Sequence[str],
        template: str | None = None,
        context: Mapping[str, Any] | None = None,
        subject: str | None = None,
        text: str | None = None,
        html: str | None = None,
        dedup_key: str | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
    ) -> int:
        """Enqueue one message in the caller's transaction (``Connection`` or ``Session``);
        return its job's id.

        Either ``template`` with its ``context``, or ``subject`` and ``text`` (and optionally
        ``html``). ``dedup_key`` is the job's idempotency key: the same key twice makes one job
        (the first one's id is returned). Bad input raises :class:`EmailInputError` before any
        SQL is sent.
        """
        payload = self._payload(to, template, context, subject, text, html, dedup_key)
        call = self.task.options(
            idempotency_key=dedup_key, delay=delay, run_at=run_at, priority=priority
        )
        return call.enqueue(conn, **payload)

    def request(
        self,
        *,
        to: str | Sequence[str],
        template: str | None = None,
        context: Mapping[str, Any] | None = None,
        subject: str | None = None,
        text: str | None = None,
        html: str | None = None,
        dedup_key: str | None = None,
    ) -> JobRequest:
        """The message :meth:`send` would enqueue, as a :class:`sqlqueue.JobRequest` to enqueue
        later with others (a step of a :class:`sqlqueue.Workflow`, ``enqueue_many``); checked
        as :meth:`send` checks it, writes nothing."""
        payload = self._payload(to, template, context, subject, text, html, dedup_key)
        return JobRequest(job_type=self.task.name, payload=payload, idempotency_key=dedup_key)

    async def send_async(
        self,
        conn: Any,
        /,
        *,
        to: str | Sequence[str],
        template: str | None = None,
        context: Mapping[str, Any] | None = None,
        subject: str | None = None,
        text: str | None = None,
        html: str | None = None,
        dedup_key: str | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
    ) -> int:
        """:meth:`send` through an ``AsyncConnection`` or ``AsyncSession``."""
        payload = self._payload(to, template, context, subject, text, html, dedup_key)
        call = self.task.options(
            idempotency_key=dedup_key, delay=delay, run_at=run_at, priority=priority
        )
        return await call.enqueue_async(conn, **payload)

    def _payload(
        self,
        to: str | Sequence[str],
        template: str | None,
        context: Mapping[str, Any] | None,
        subject: str | None,
        text: str | None,
        html: str | None,
        dedup_key: str | None,
    ) -> dict[str, Any]:
        """The job's payload: checked recipients, the Message-ID, the ledger key, and the
        template's name and version with its context, or the content and its hash."""
        recipients = check_recipients(to)
        message_id = mint_message_id(self.sender)
        payload: dict[str, Any] = {
            "message_id": message_id,
            "sender": self.sender,
            "to": recipients,
            # The ledger's key: what "already sent" means for this message.
            "key": dedup_key if dedup_key is not None else message_id,
        }
        if template is not None:
            if subject is not None or text is not None or html is not None:
                raise EmailInputError("give either template= or subject=/text=/html=, not both")
            found = self._templates.get(template)
            if found is None:
                known = ", ".join(sorted(self._templates)) or "none"
                raise UnknownTemplate(f"no template named {template!r} (registered: {known})")
            if context is not None and not isinstance(context, Mapping):
                raise EmailInputError(f"context must be a mapping, got {type(context).__name__}")
            arguments = dict(context or {})
            try:
                found.signature.bind(**arguments)
            except TypeError as error:
                raise EmailInputError(
                    f"template {template!r} takes {found.signature}: {error}"
                ) from None
            payload["template"] = {"name": template, "version": found.version}
            payload["context"] = arguments
            return payload
        if context is not None:
            raise EmailInputError("context= goes with template=; without one give subject/text")
        if subject is None or text is None:
            raise EmailInputError("give template=, or subject= and text= (html= is optional)")
        try:
            content = Content(subject=subject, text=text, html=html)
        except ConfigurationError as error:
            raise EmailInputError(str(error)) from None
        try:  # the message it makes, generated and checked as an attempt will: refused now
            trial = build_message(
                sender=self.sender,
                to=recipients,
                message_id=message_id,
                content=content,
                date=datetime.now(UTC),
            )
            flatten(trial, utf8=True, eight_bit=True)
        except UnsafeHeader as error:
            raise EmailInputError(str(error)) from None
        payload["content"] = {
            "subject": content.subject,
            "text": content.text,
            "html": content.html,
            "hash": content_hash(content),
        }
        return payload

    # -- the task -----------------------------------------------------------------------------

    async def _deliver(
        self,
        ctx: JobContext,
        message_id: str,
        sender: str,
        to: list[str],
        key: str,
        template: dict[str, str] | None = None,
        context: dict[str, Any] | None = None,
        content: dict[str, Any] | None = None,
        recipients: list[str] | None = None,
        deferred_from: int | None = None,
    ) -> dict[str, Any]:
        """One attempt at one message (see the module's docstring for the steps).

        ``recipients`` (a follow-up's payload only) are the envelope recipients when they are
        not all of ``to``: the message keeps its ``To`` header and goes to these alone.
        ``deferred_from`` is the job whose 4xx-refused recipients they are.
        """
        sent = await asyncio.to_thread(find_sent, ctx.engine, key, ctx.schema)
        if sent is not None:
            ctx.logger.info(
                "%s was already sent under key %r (by job %s): not sending it again",
                sent["message_id"],
                key,
                sent["sent_by_job"],
            )
            return {**sent, "already_sent": True}
        rendered, what = await self._render(ctx, template, context, content)
        message = build_message(
            sender=sender, to=to, message_id=message_id, content=rendered, date=ctx.now()
        )
        flatten(message, utf8=True, eight_bit=True)  # UnsafeHeader before any connection
        delivery = await deliver(
            self.smtp,
            message,
            sender=envelope_address(sender),
            recipients=(
                recipients
                if recipients is not None
                else [envelope_address(address) for address in to]
            ),
            pool=self._pool,
        )
        sent_at = ctx.now()
        follow_up: int | None = None
        async with ctx.transaction_async() as conn:
            await record_sent(
                conn,
                key=key,
                message_id=message_id,
                job_id=ctx.job_id,
                sent_at=sent_at,
                delivery=delivery,
                schema=ctx.schema,
            )
            if delivery.deferred:
                follow_up = await self._enqueue_deferred(
                    conn,
                    ctx,
                    message_id=message_id,
                    sender=sender,
                    to=to,
                    key=key,
                    deferred=delivery.deferred,
                    template=what.get("template"),
                    context=context,
                    content=content,
                )
        if delivery.refused:
            ctx.logger.warning(
                "%s: the server refused %s", message_id, ", ".join(sorted(delivery.refused))
            )
        result: dict[str, Any] = {
            "message_id": message_id,
            "reply": delivery.reply,
            "accepted": delivery.accepted,
            "refused": delivery.refused,
            "sent_at": sent_at.isoformat(),
            **what,
        }
        if deferred_from is not None:
            result["deferred_from"] = deferred_from
        if delivery.deferred:
            ctx.logger.warning(
                "%s: %s deferred (4xx) to job %s",
                message_id,
                ", ".join(delivery.deferred),
                follow_up,
            )
            result["deferred"] = delivery.deferred
            result["deferred_job"] = follow_up
        return result

    async def _enqueue_deferred(
        self,
        conn: Any,
        ctx: JobContext,
        *,
        message_id: str,
        sender: str,
        to: list[str],
        key: str,
        deferred: list[str],
        template: dict[str, str] | None,
        context: dict[str, Any] | None,
        content: dict[str, Any] | None,
    ) -> int:
        """Enqueue, in the attempt's transaction ``conn``, the job that sends this message to
        the ``deferred`` recipients alone; return its id (the existing one's, when this success
        path already ran: the dedup key is the same)."""
        follow_up_key = deferred_key(key, deferred)
        payload: dict[str, Any] = {
            "message_id": message_id,
            "sender": sender,
            "to": to,
            "recipients": deferred,
            # Its own ledger entry: this message's key says the message went out to the others.
            "key": follow_up_key,
            "deferred_from": ctx.job_id,
        }
        if template is not None:
            # The version this attempt rendered: the deferred get what the others got.
            payload["template"] = {"name": template["name"], "version": template["version"]}
            payload["context"] = context or {}
        else:
            payload["content"] = content
        call = self.task.options(idempotency_key=follow_up_key, delay=self.task.backoff.delay(1))
        return await call.enqueue_async(conn, **payload)

    async def _render(
        self,
        ctx: JobContext,
        template: dict[str, str] | None,
        context: dict[str, Any] | None,
        content: dict[str, Any] | None,
    ) -> tuple[Content, dict[str, Any]]:
        """The content to send, and what the result says about where it came from."""
        if template is None:
            if content is None:
                raise PermanentError("the payload has neither a template nor content")
            try:
                sent = Content(
                    subject=content["subject"], text=content["text"], html=content["html"]
                )
            except ConfigurationError as error:  # written around Mailer.send (raw SQL …)
                raise UnsafeHeader(f"the job's content cannot be sent: {error}") from None
            return sent, {"content_hash": content["hash"]}
        name, enqueued = template["name"], template["version"]
        current = self._templates.get(name)
        if current is None:
            raise PermanentError(
                f"template {name!r} (version {enqueued} at enqueue) is not registered on this "
                "worker's Mailer: register it, then requeue the job"
            )
        if current.version != enqueued:
            if self.on_template_change == "fail":
                raise TemplateChanged(
                    f"template {name!r} is version {current.version} now, the job was enqueued "
                    f"for version {enqueued} (on_template_change='fail')"
                )
            ctx.logger.warning(
                "template %r is version %s now, enqueued for %s: rendering version %s",
                name,
                current.version,
                enqueued,
                current.version,
            )
        try:
            rendered = current.render(**(context or {}))
            if inspect.isawaitable(rendered):
                rendered = await rendered
        except ConfigurationError as error:  # Content refused what it rendered: every time
            raise UnsafeHeader(f"template {name!r} rendered unsendable content: {error}") from None
        if not isinstance(rendered, Content):
            raise TypeError(
                f"template {name!r} returned {type(rendered).__name__}, not sqlqueue.email.Content"
            )
        return rendered, {
            "template": {"name": name, "version": current.version, "enqueued_version": enqueued}
        }


def _context_paths(fields: Sequence[str] | None) -> list[str] | None:
    """The task's ``secret_fields`` for a Mailer's: each path is one into the ``context``.
    The paths themselves are checked with the task (``Queue.task``)."""
    if fields is None:
        return None
    if isinstance(fields, str) or not isinstance(fields, Sequence):
        raise ConfigurationError(
            f"secret_fields must be a list of names in a template's context, e.g. "
            f"['token'], got {fields!r}"
        )
    for field in fields:
        if not isinstance(field, str) or not field:
            raise ConfigurationError(
                f"secret_fields holds {field!r}; each is a name (or dotted path) in a "
                "template's context, e.g. 'token' or 'user.reset_token'"
            )
    return [f"context.{field}" for field in fields]


#: The longest dedup key the jobs' ``idempotency_key`` and the ledger's ``key`` hold.
_MAX_KEY = 255


def deferred_key(key: str, recipients: Sequence[str]) -> str:
    """The dedup key of the follow-up that sends message ``key`` to ``recipients``: the same
    for the same message and recipients (in any order), so it is enqueued once."""
    digest = hashlib.sha256("\n".join(sorted(recipients)).encode()).hexdigest()[:16]
    derived = f"{key}:deferred:{digest}"
    if len(derived) > _MAX_KEY:  # a long dedup key, or a follow-up's follow-up: still bounded
        derived = f"sha256:{hashlib.sha256(key.encode()).hexdigest()}:deferred:{digest}"
    return derived
