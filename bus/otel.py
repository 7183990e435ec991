"""OpenTelemetry spans, when the ``[otel]`` extra is installed and an exporter is configured.

Spans are named as the GenAI conventions name them: ``invoke_agent <agent>``
(Gateway, a whole turn), ``chat <model>`` (Brain, one model call) and
``execute_tool <tool>`` (Hands, one call), with ``gen_ai.*`` attributes.
Each starts from ``bus.trace.current`` (the traceparent its message
carried) and, while open, makes its own context current, so what it writes
on the bus names it as parent: one trace per turn across the processes.
Without the extra or an exporter nothing is imported and ``span`` is a
no-op.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bus import trace
from bus.private_file import append_private
from bus.settings import RuntimeSettings

log = logging.getLogger("bus.otel")

_tracer: Any = None  # an opentelemetry Tracer once set up
_propagator: Any = None


def setup(role: str, runtime: RuntimeSettings) -> None:
    """Start exporting this process's spans, if configured; say plainly when the extra is missing."""
    global _tracer, _propagator
    if runtime.otel_exporter == "none":
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        log.warning("runtime.otel_exporter is %r but OpenTelemetry is not installed: pip install 'pincer[otel]'",
                    runtime.otel_exporter)
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"pincer-{role}",
                                                        "service.instance.id": str(os.getpid())}))
    exporter: Any
    if runtime.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=runtime.otel_endpoint) if runtime.otel_endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    else:  # console: one JSON span a line, to a file of this process's own (debugging, tests)
        path = f"{runtime.otel_file or 'pincer-spans'}.{role}.{os.getpid()}.jsonl"
        out = append_private(Path(path))  # open for the process's life; what a turn did is its user's alone
        exporter = ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracer, _propagator = provider.get_tracer("pincer"), TraceContextTextMapPropagator()
    log.info("exporting spans (%s)", runtime.otel_exporter)


_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()  # stateless: one for every caller


def span(name: str, *, kind: str = "internal", **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span that is the child of the current trace context (a no-op without OpenTelemetry: no generator
    made and stepped for each tool call and model call)."""
    return _NO_SPAN if _tracer is None else _span(name, kind, attributes)


@contextlib.contextmanager
def _span(name: str, kind: str, attributes: dict[str, Any]) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    parent = _propagator.extract({"traceparent": trace.current.get()} if trace.current.get() else {})
    with _tracer.start_as_current_span(name, context=parent, kind=SpanKind[kind.upper()],
                                       attributes={k.replace("__", "."): v for k, v in attributes.items()
                                                   if v is not None}) as opened:
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
        token = trace.current.set(carrier.get("traceparent") or trace.current.get())
        try:
            yield opened
        finally:
            trace.current.reset(token)


def set_attributes(opened: Any, **attributes: Any) -> None:
    if opened is not None:
        opened.set_attributes({k.replace("__", "."): v for k, v in attributes.items() if v is not None})


def begin(name: str, *, kind: str = "server", **attributes: Any) -> tuple[Any, str | None]:
    """Open a span without making it current (it outlives this frame); its traceparent to write with.
    ``end`` closes it. (None, None) without OpenTelemetry."""
    if _tracer is None:
        return None, None
    from opentelemetry.trace import SpanKind, set_span_in_context

    parent = _propagator.extract({"traceparent": trace.current.get()} if trace.current.get() else {})
    opened = _tracer.start_span(name, context=parent, kind=SpanKind[kind.upper()],
                                attributes={k.replace("__", "."): v for k, v in attributes.items() if v is not None})
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=set_span_in_context(opened))
    return opened, carrier.get("traceparent")


def end(opened: Any, *, error: str | None = None) -> None:
    if opened is None:
        return
    if error:
        from opentelemetry.trace import Status, StatusCode

        opened.set_attribute("error.type", error)
        opened.set_status(Status(StatusCode.ERROR, error))
    opened.end()
