"""``python -m bench.observe_worker MODE ARGS…``: ``python -m sqlqueue ARGS…`` with its
observability set up as ``MODE`` says, for bench/observe.py.

``no-otel`` hides OpenTelemetry before sqlqueue is imported (as if it were not installed);
``otel`` leaves it installed but unconfigured (the API's no-op provider); ``tracing`` sets a
global SDK ``TracerProvider`` whose ``BatchSpanProcessor`` exports to a sink that drops every
span, so the worker pays for making, ending and batching spans but nothing for their export.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["MODES", "main"]

MODES = ("no-otel", "otel", "tracing")


def _trace_to_nowhere() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        """Accepts every batch and keeps nothing but a count, logged at shutdown."""

        def __init__(self) -> None:
            self.count = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.count += len(spans)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            print(f"bench.observe_worker: dropped {self.count} spans", file=sys.stderr)

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)


def main(argv: Sequence[str]) -> int:
    """Set up ``argv[0]``'s mode, then run sqlqueue's command line with the rest."""
    mode, *rest = argv
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "no-otel":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    elif mode == "tracing":
        _trace_to_nowhere()
    from sqlqueue.cli import main as sqlqueue_main

    return sqlqueue_main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
