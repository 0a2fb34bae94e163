"""OpenTelemetry trace context, carried from the producer through park and promotion, when it is installed.

A park inside a span is traced as a ``delay_broker park`` span (a child of the producer's), whose context is
stored in the envelope header (``x.otel``: W3C ``traceparent``/``tracestate``, as the global propagator
writes them). The at-least-once promoter delivers each such message inside a ``delay_broker promote`` span
continuing that trace, so a consumer instrumented to read the context its broker's publish carries lands in
the same trace, however long the message was parked. The exactly-once path promotes inside Redis, one script
per batch: the script hands back the stored context of each message it moved, and the promoter records a
``delay_broker promote`` span for each, in its trace, spanning the script's round trip.

Nothing here runs without ``opentelemetry-api`` (the ``otel`` extra) and an active span: no context, no cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any

CARRIER_KEY = "otel"
"""Key of the stored context in the envelope header's extras."""
TRACER_NAME = "delay_broker"


@cache
def _otel() -> tuple[Any, Any] | None:
    """``(opentelemetry.trace, opentelemetry.propagate)``, or None when OpenTelemetry is not installed."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:  # pragma: no cover - depends on the install
        return None
    return trace, propagate


def active() -> bool:
    """Whether a park now would be traced: OpenTelemetry is installed and the caller is inside a span."""
    otel = _otel()
    return otel is not None and otel[0].get_current_span().get_span_context().is_valid


_active = active


@contextlib.contextmanager
def park_span(count: int, route: str | None) -> Iterator[None]:
    """A ``delay_broker park`` span around a park, when the producer is inside a span of its own."""
    if not _active():
        yield
        return
    trace, _ = _otel()  # type: ignore[misc]
    attributes: dict[str, Any] = {"messaging.system": "delay_broker", "messaging.batch.message_count": count}
    if route is not None:
        attributes["messaging.destination.name"] = route
    with trace.get_tracer(TRACER_NAME).start_as_current_span(
        "delay_broker park", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ):
        yield


def current_carrier() -> dict[str, str] | None:
    """The current trace context as a park stores it (see :func:`with_carrier`), or None when there is none: read
    once for a whole batch of parks."""
    if not _active():
        return None
    carrier: dict[str, str] = {}
    _otel()[1].inject(carrier)  # type: ignore[index]
    return carrier or None


def with_carrier(extra: Mapping[str, Any], carrier: Mapping[str, str]) -> dict[str, Any]:
    """``extra`` with ``carrier`` (of :func:`current_carrier`) added."""
    return {**extra, CARRIER_KEY: dict(carrier)}


def with_context(extra: Mapping[str, Any], *, keep: bool = False) -> dict[str, Any]:
    """``extra`` with the current trace context added, if there is one (else unchanged). ``keep``: a context
    ``extra`` already carries stays (a message rewritten after it was parked keeps its producer's trace)."""
    if not _active() or (keep and CARRIER_KEY in extra):
        return dict(extra)
    carrier: dict[str, str] = {}
    _otel()[1].inject(carrier)  # type: ignore[index]
    return {**extra, CARRIER_KEY: carrier} if carrier else dict(extra)


@contextlib.contextmanager
def promote_span(id: str, route: str, extra: Mapping[str, Any]) -> Iterator[None]:
    """A ``delay_broker promote`` span continuing the trace a message was parked in (if it was)."""
    carrier = extra.get(CARRIER_KEY)
    otel = _otel()
    if otel is None or not isinstance(carrier, dict):
        yield
        return
    trace, propagate = otel
    # Only strings go to the propagator: the header is data read back from Redis.
    context = propagate.extract({str(k): v for k, v in carrier.items() if isinstance(v, str)})
    attributes = {"messaging.system": "delay_broker", "messaging.message.id": id, "messaging.destination.name": route}
    with trace.get_tracer(TRACER_NAME).start_as_current_span(
        "delay_broker promote", context=context, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ):
        yield


def record_promotions(traced: Iterable[Any], started_ns: int, ended_ns: int) -> None:
    """``delay_broker promote`` spans for messages an exactly-once promotion moved (:class:`TracedPromotion`),
    each in the trace it was parked in, timed as the script that moved them."""
    otel = _otel()
    if otel is None:
        return
    trace, propagate = otel
    tracer = trace.get_tracer(TRACER_NAME)
    for promotion in traced:
        carrier = {"traceparent": promotion.traceparent}
        if promotion.tracestate:
            carrier["tracestate"] = promotion.tracestate
        attributes = {
            "messaging.system": "delay_broker",
            "messaging.message.id": promotion.id,
            "messaging.destination.name": promotion.route,
        }
        span = tracer.start_span(
            "delay_broker promote",
            context=propagate.extract(carrier),
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
            start_time=started_ns,
        )
        span.end(end_time=ended_ns)
