"""The public API is small, importable from ``sqlqueue``, and everything else is private."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import sqlqueue

PUBLIC = {
    "Activity",
    "Alarm",
    "Backoff",
    "Batch",
    "BatchStatus",
    "CircuitBreaker",
    "Concurrency",
    "ConfigurationError",
    "DatabaseError",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "EnqueueError",
    "ErrorCount",
    "ErrorRecord",
    "Health",
    "HandlerSignal",
    "Job",
    "JobAction",
    "JobContext",
    "JobLogFilter",
    "JobNotFound",
    "JobRequest",
    "JobStateError",
    "JobStatus",
    "JobTimeout",
    "JsonLogFormatter",
    "MinuteActivity",
    "PayloadError",
    "PermanentError",
    "Progress",
    "Queue",
    "QueueStats",
    "RateLimit",
    "Retention",
    "Retry",
    "SchemaNotMigrated",
    "Snooze",
    "SqlqueueError",
    "Stats",
    "StepStatus",
    "Task",
    "TaskCall",
    "Unique",
    "UnknownJobType",
    "UnsupportedDatabase",
    "Worker",
    "WorkerInfo",
    "Workflow",
    "WorkflowError",
    "WorkflowHandle",
    "WorkflowStatus",
    "WorkflowSummary",
    "exponential",
    "linear",
    "migrate",
    "schedule",
}


def test_all_names_exactly_the_public_api():
    assert set(sqlqueue.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(sqlqueue, name) is not None


def test_importing_sqlqueue_loads_each_public_name_when_used() -> None:
    """``import sqlqueue`` loads nothing else; every public name is still there, and one
    name loads what it needs only."""
    script = (
        "import sys, sqlqueue\n"
        "before = {m.partition('.')[0] for m in sys.modules}\n"
        "print(set(sqlqueue.__all__) <= set(dir(sqlqueue)))\n"
        "sqlqueue.Retry\n"
        "after = {m.partition('.')[0] for m in sys.modules}\n"
        "print(sorted(before & {'sqlalchemy', 'alembic'}), sorted(after & {'sqlalchemy'}))\n"
        "print(all(getattr(sqlqueue, name) is not None for name in sqlqueue.__all__))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["True", "[] []", "True"]
    with pytest.raises(AttributeError, match="has no attribute 'Queu'"):
        sqlqueue.Queu  # noqa: B018  # a typo still fails as it should


def test_every_error_derives_from_sqlqueue_error():
    for name in PUBLIC:
        value = getattr(sqlqueue, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, sqlqueue.SqlqueueError), name


def test_modules_other_than_dialects_and_the_kinds_are_private():
    names = {info.name for info in pkgutil.iter_modules(sqlqueue.__path__)}
    public_subpackages = {"asgi", "cli", "dialects", "django", "email", "flask", "testing", "web"}
    public_subpackages |= {"webhooks"}
    assert names - public_subpackages == {name for name in names if name.startswith("_")}


def test_the_framework_integrations_name_exactly_their_public_api():
    import sqlqueue.asgi
    import sqlqueue.django
    import sqlqueue.flask

    assert set(sqlqueue.asgi.__all__) == {"Lifespan", "lifespan"}
    assert set(sqlqueue.flask.__all__) == {"COMMANDS", "init_app"}
    assert set(sqlqueue.django.__all__) == {"database_url", "queue"}
    # Django's conventions name these: the app's config, its management commands and its
    # migrations; and the Tasks framework's backend, whose path is a setting (TASKS).
    modules = {info.name for info in pkgutil.iter_modules(sqlqueue.django.__path__)}
    django_names = {"apps", "management", "migrations", "tasks"}
    assert modules - django_names == {n for n in modules if n.startswith("_")}
    import sqlqueue.django.tasks

    assert set(sqlqueue.django.tasks.__all__) == {"Backend"}


EMAIL_PUBLIC = {
    "SMTP",
    "Content",
    "EmailInputError",
    "InvalidAddress",
    "Mailer",
    "SMTPPermanentError",
    "SMTPTemporaryError",
    "TemplateChangePolicy",
    "TemplateChanged",
    "UnknownTemplate",
    "UnsafeHeader",
}


def test_the_email_kind_names_exactly_its_public_api():
    import sqlqueue.email

    assert set(sqlqueue.email.__all__) == EMAIL_PUBLIC
    for name in EMAIL_PUBLIC:
        assert getattr(sqlqueue.email, name) is not None
    modules = {info.name for info in pkgutil.iter_modules(sqlqueue.email.__path__)}
    assert all(name.startswith("_") for name in modules)
    for name in EMAIL_PUBLIC:
        value = getattr(sqlqueue.email, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, sqlqueue.SqlqueueError), name


def test_the_test_helpers_name_exactly_their_public_api():
    import sqlqueue.testing

    assert set(sqlqueue.testing.__all__) == {
        "DrainResult",
        "age_jobs",
        "assert_enqueued",
        "drain",
        "drain_async",
        "enqueued_jobs",
    }


def test_job_status_compares_equal_to_plain_strings():
    assert str(sqlqueue.JobStatus.DEAD) == "dead"
    assert sqlqueue.JobStatus("dead") is sqlqueue.JobStatus.DEAD
    assert [s.value for s in sqlqueue.JobStatus] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "dead",
        "cancelled",
        "waiting",
    ]


def test_the_command_line_names_exactly_its_public_api():
    import argparse

    import sqlqueue.cli

    assert set(sqlqueue.cli.__all__) == {"build_parser", "main"}
    modules = {info.name for info in pkgutil.iter_modules(sqlqueue.cli.__path__)}
    assert modules
    assert all(name.startswith("_") for name in modules)
    parser = sqlqueue.cli.build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"migrate", "worker", "stats", "health", "jobs", "dead", "web"} <= set(commands.choices)
