"""Reference pages generated from the code, so they cannot drift from it.

Directives (usable from MyST pages as ```{name}``` fences):

- ``sqlqueue-tables``: every table of ``sqlqueue._schema.metadata``, its columns (type as
  PostgreSQL spells it, nullability, key) and its indexes (columns, unique, partial predicate).
- ``sqlqueue-metrics``: the Prometheus families a worker serves, read from the collectors'
  ``describe()`` (name, type, labels, help text).
- ``sqlqueue-log-fields``: the fields of a JSON log line, read from a record formatted by
  ``JsonLogFormatter`` with the ``extra`` fields a worker puts on a job's records.
- ``sqlqueue-errors``: the tree of every public exception type (``SqlqueueError`` and its
  subclasses that the public modules export), each a cross-reference to its autodoc entry.
- ``sqlqueue-cli``: every command of the ``sqlqueue`` program, walked from its argparse parser
  (``sqlqueue_cli_parser`` in conf.py names it): usage, description and options.

A reference to a private path of a public name (autodoc writes ``sqlqueue._queue.Queue`` in
signatures) is resolved to its public name (``sqlqueue.Queue``), and every name the public
modules export must have an entry in the reference: a new one without fails the build.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
from collections.abc import Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging as sphinx_logging
from sphinx.util.docutils import SphinxDirective

logger = sphinx_logging.getLogger(__name__)

#: What each table is for: one sentence. A table missing here is listed without one.
TABLE_PURPOSES = {
    "sqlqueue_jobs": "One row per job: what to do, when to try again, what happened last time.",
    "sqlqueue_rate_limits": "A token bucket per rate-limit key, shared by every worker.",
    "sqlqueue_circuit_breakers": "The state of each circuit breaker key, shared by every worker.",
    "sqlqueue_queues": "Queues an operator paused: who, when, why.",
    "sqlqueue_finished_counts": "Counts of finished jobs folded in by the workers, for stats.",
    "sqlqueue_count_marks": "How far the finished counts have been folded.",
    "sqlqueue_duties": "The lease on a duty one worker at a time performs (retention).",
    "sqlqueue_webhook_endpoints": "The webhook kind's receivers, their secrets and state.",
    "sqlqueue_email_sent": "The email kind's ledger: one row per message a server accepted.",
    "sqlqueue_batches": "A batch's counters and its callback jobs, until it ends.",
    "sqlqueue_workers": "Live worker processes: host, pid, queues, job types, last heartbeat.",
    "sqlqueue_workflow_steps": "A workflow's steps: current job, upstreams not yet ended.",
    "sqlqueue_workflow_edges": "A workflow's graph: which step runs after which.",
}

#: What each field of a JSON log line holds. A field the code emits that is missing here fails
#: the build, so a new field cannot go undocumented.
LOG_FIELDS = {
    "timestamp": "When the record was made, UTC, ISO 8601.",
    "level": "The record's level name (``INFO``, ``WARNING`` …).",
    "logger": "The logger's name: ``sqlqueue.worker``, ``sqlqueue.job``, or the app's own.",
    "message": "The formatted message.",
    "job_id": "The job being run (records logged during an attempt).",
    "job_type": "Its job type.",
    "queue": "Its queue.",
    "attempt": "The attempt number, 1 for the first.",
    "worker_id": "The worker process (``host:pid:suffix``); also on records outside a job.",
    "exception": "The traceback text, when the record carries an exception.",
    "stack": "The stack text, when the record was logged with ``stack_info``.",
}

#: The modules whose exported exception types make up the public error tree.
PUBLIC_MODULES = (
    "sqlqueue",
    "sqlqueue.email",
    "sqlqueue.webhooks",
    "sqlqueue.web",
    "sqlqueue.testing",
    "sqlqueue.asgi",
    "sqlqueue.flask",
    "sqlqueue.django",
)


def _text_table(headers: Sequence[str], rows: Iterable[Sequence[nodes.Node | str]]) -> nodes.table:
    """A docutils table; a ``str`` cell is shown as inline code, a node as it is."""
    table = nodes.table()
    group = nodes.tgroup(cols=len(headers))
    table += group
    for _ in headers:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    group += head
    head += _row([nodes.Text(header) for header in headers])
    body = nodes.tbody()
    group += body
    for cells in rows:
        body += _row([nodes.literal(text=c) if isinstance(c, str) else c for c in cells])
    return table


def _row(cells: Sequence[nodes.Node]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += nodes.paragraph("", "", cell) if not isinstance(cell, nodes.paragraph) else cell
        row += entry
    return row


def _section(document: Any, title: str, ident: str) -> nodes.section:
    section = nodes.section(ids=[ident], names=[nodes.fully_normalize_name(title)])
    section += nodes.title(text=title)
    document.note_implicit_target(section, section)
    return section


def _column_type(column: sa.Column[Any]) -> str:
    from sqlalchemy.dialects import postgresql

    try:
        return str(column.type.compile(dialect=postgresql.dialect()))
    except sa.exc.CompileError:  # a type only some backends know
        return type(column.type).__name__


class TablesDirective(SphinxDirective):
    """Every table of the schema, with its columns and indexes."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from sqlqueue._schema import metadata

        out: list[nodes.Node] = []
        for table in sorted(metadata.tables.values(), key=lambda t: t.name):
            section = _section(self.state.document, table.name, f"table-{table.name}")
            purpose = TABLE_PURPOSES.get(table.name)
            if purpose:
                section += nodes.paragraph(text=purpose)
            keys = {column.name for column in table.primary_key.columns}
            section += _text_table(
                ["column", "type (PostgreSQL)", "null", "key"],
                (
                    [
                        column.name,
                        _column_type(column),
                        nodes.Text("yes" if column.nullable else "no"),
                        nodes.Text("primary" if column.name in keys else ""),
                    ]
                    for column in table.columns
                ),
            )
            indexes = sorted(table.indexes, key=lambda index: index.name or "")
            if indexes:
                section += _text_table(
                    ["index", "columns", "unique", "only rows where"],
                    (
                        [
                            index.name or "",
                            ", ".join(column.name for column in index.columns),
                            nodes.Text("yes" if index.unique else ""),
                            _predicate(index),
                        ]
                        for index in indexes
                    ),
                )
            out.append(section)
        return out


def _predicate(index: sa.Index) -> nodes.Node:
    where = index.dialect_options["postgresql"].get("where")
    return nodes.literal(text=str(where)) if where is not None else nodes.Text("")


class MetricsDirective(SphinxDirective):
    """The Prometheus families a worker serves."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from sqlqueue._worker.prometheus import CallTally, OutcomeTally, QueueGauges

        families = [
            *OutcomeTally().describe(),
            *CallTally().describe(),
            *QueueGauges(stats=_no_stats, interval=1).describe(),
        ]
        rows = []
        for family in families:
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = ", ".join(getattr(family, "_labelnames", ()))
            rows.append([name, nodes.Text(family.type), labels, nodes.Text(family.documentation)])
        return [_text_table(["metric", "type", "labels", "what"], rows)]


def _no_stats() -> Any:
    raise ExtensionError("the docs never read stats")


class LogFieldsDirective(SphinxDirective):
    """The fields of a worker's JSON log line about a job."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from sqlqueue._logs import JsonLogFormatter, job_fields

        job = SimpleNamespace(id=1, job_type="t", queue="q", attempt=1)
        record = logging.LogRecord("sqlqueue.job", logging.INFO, __file__, 1, "m", None, None)
        record.__dict__.update(job_fields(job, "w"))  # type: ignore[arg-type]
        fields = list(json.loads(JsonLogFormatter().format(record)))
        fields += ["exception", "stack"]  # present only on records that carry them
        missing = [field for field in fields if field not in LOG_FIELDS]
        if missing:
            raise ExtensionError(f"describe the log fields {missing} in {__name__}.LOG_FIELDS")
        rows = [[field, self._parse(LOG_FIELDS[field])] for field in fields]
        return [_text_table(["field", "what"], rows)]

    def _parse(self, text: str) -> nodes.Node:
        paragraph = nodes.paragraph()
        for i, part in enumerate(text.split("``")):
            paragraph += nodes.literal(text=part) if i % 2 else nodes.Text(part)
        return paragraph


class ErrorsDirective(SphinxDirective):
    """The public exception types as a tree, rooted at ``SqlqueueError``."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        exported: dict[type, str] = {}
        for module_name in PUBLIC_MODULES:
            module = importlib.import_module(module_name)
            for name in getattr(module, "__all__", ()):
                value = getattr(module, name)
                if isinstance(value, type) and issubclass(value, BaseException):
                    exported.setdefault(value, f"{module_name}.{name}")
        root = importlib.import_module("sqlqueue").SqlqueueError
        return [self._tree(root, exported)]

    def _tree(self, cls: type, exported: dict[type, str]) -> nodes.bullet_list:
        items = nodes.bullet_list()
        item = nodes.list_item()
        items += item
        item += self._entry(cls, exported)
        children = [sub for sub in exported if _nearest(sub, exported) is cls]
        nested = nodes.bullet_list()
        for sub in sorted(children, key=lambda c: exported[c]):
            nested += self._tree(sub, exported).children[0]
        if children:
            item += nested
        return items

    def _entry(self, cls: type, exported: dict[type, str]) -> nodes.paragraph:
        target = exported[cls]
        ref = addnodes.pending_xref(
            "", refdomain="py", reftype="exc", reftarget=target, refexplicit=False
        )
        ref += nodes.literal(text=target)
        paragraph = nodes.paragraph("", "", ref)
        others = [exported[base] for base in cls.__bases__[1:] if base in exported]
        if others:
            paragraph += nodes.Text(" (also " + ", ".join(others) + ")")
        return paragraph


def _nearest(cls: type, exported: dict[type, str]) -> type | None:
    """The first exported class in ``cls``'s method resolution order after itself: its
    parent in the tree (other exported bases are named beside it)."""
    for base in cls.__mro__[1:]:
        if base in exported:
            return base
    return None


class CliDirective(SphinxDirective):
    """The ``sqlqueue`` command and each subcommand, from the parser itself."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        module_name, _, function = self.config.sqlqueue_cli_parser.partition(":")
        parser = getattr(importlib.import_module(module_name), function)()
        return self._command(parser, parser.prog)

    def _command(self, parser: argparse.ArgumentParser, name: str) -> list[nodes.Node]:
        section = _section(self.state.document, name, "cli-" + name.replace(" ", "-"))
        if parser.description:
            section += nodes.paragraph(text=parser.description)
        section += nodes.literal_block(text=parser.format_usage().strip())
        rows = []
        subcommands: list[tuple[str, argparse.ArgumentParser]] = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for sub_name, sub_parser in action.choices.items():
                    if sub_parser.description is None and helps.get(sub_name):
                        sub_parser.description = helps[sub_name]
                    subcommands.append((sub_name, sub_parser))
                continue
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(action.option_strings) or (action.metavar or action.dest)
            value = ""
            if action.choices:
                value = "{" + ",".join(map(str, action.choices)) + "}"
            elif action.nargs != 0 and action.option_strings:
                value = str(action.metavar or action.dest.upper())
            default = action.default
            shown = (
                ""
                if default in (None, False, argparse.SUPPRESS) or not action.option_strings
                else repr(default)
            )
            rows.append([f"{flags} {value}".strip(), nodes.Text(action.help or ""), shown])
        if rows:
            section += _text_table(["argument", "what", "default"], rows)
        out: list[nodes.Node] = [section]
        for sub_name, sub_parser in subcommands:
            section += self._command(sub_parser, f"{name} {sub_name}")
        return out


def _public_reference(
    app: Sphinx, env: Any, node: addnodes.pending_xref, contnode: nodes.Element
) -> nodes.Element | None:
    """Resolve ``sqlqueue._x.Name`` (a signature's path) to ``<public module>.Name``."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("sqlqueue.") or "._" not in target:
        return None
    name = target.rsplit(".", 1)[1]
    domain = env.get_domain("py")
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        if name in getattr(module, "__all__", ()):
            new = node.deepcopy()
            new["reftarget"] = f"{module_name}.{name}"
            return domain.resolve_xref(
                env,
                node.get("refdoc", ""),
                app.builder,
                node["reftype"],
                new["reftarget"],
                new,
                contnode,
            )
    return None


def _check_public_names(app: Sphinx, env: Any) -> None:
    """Warn (an error under ``-W``) for every exported name the reference does not document."""
    documented = env.get_domain("py").objects
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            if f"{module_name}.{name}" not in documented:
                logger.warning(
                    "%s.%s is exported but has no entry in the reference (document it, or add "
                    "an autodata line to its page)",
                    module_name,
                    name,
                )


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("env-check-consistency", _check_public_names)
    app.add_config_value("sqlqueue_cli_parser", "sqlqueue.cli:build_parser", "env")
    app.add_directive("sqlqueue-cli", CliDirective)
    app.connect("missing-reference", _public_reference)
    app.add_directive("sqlqueue-tables", TablesDirective)
    app.add_directive("sqlqueue-metrics", MetricsDirective)
    app.add_directive("sqlqueue-log-fields", LogFieldsDirective)
    app.add_directive("sqlqueue-errors", ErrorsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
