"""OpenTelemetry: the producer's trace continues through park and promotion, on a real redis-server."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from delay_broker import ClaimedMessage, DelayStore, Envelope, Promoter
from delay_broker.tracing import CARRIER_KEY

from .helpers import wait_for


@pytest.fixture(scope="module")
def exporter():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # The global provider can be set once per process; tests share it and clear the exporter.
    trace.set_tracer_provider(provider)
    return exporter


@pytest.fixture
def spans(exporter):
    exporter.clear()
    yield exporter
    exporter.clear()


class Recording:
    """An at-least-once deliverer that notes the span current while it publishes each message."""

    def __init__(self) -> None:
        self.seen: dict[str, trace.SpanContext] = {}

    def deliver(self, message: ClaimedMessage) -> None:
        self.seen[message.id] = trace.get_current_span().get_span_context()


def promote_until(store: DelayStore, deliverer, done) -> Promoter:
    """Run a promoter until ``done()``; returns it, stopped."""
    promoter = Promoter(store, deliverer, max_idle=0.5).start()
    try:
        wait_for(done)
    finally:
        promoter.stop()
    return promoter


def test_a_message_parked_inside_a_span_is_promoted_in_the_same_trace(store: DelayStore, spans):
    tracer = trace.get_tracer("producer-app")
    with tracer.start_as_current_span("handle request") as request_span:
        store.park("traced", Envelope(route="emails", name="send_welcome", payload=b"x"), delay=0)
    stored = store.get("traced").envelope  # type: ignore[union-attr]
    assert stored is not None and stored.extra[CARRIER_KEY]["traceparent"].startswith("00-")
    deliverer = Recording()
    promote_until(store, deliverer, lambda: "traced" in deliverer.seen)

    by_name = {span.name: span for span in spans.get_finished_spans()}
    park, promote = by_name["delay_broker park"], by_name["delay_broker promote"]
    trace_id = request_span.get_span_context().trace_id
    assert park.context.trace_id == promote.context.trace_id == trace_id, "one trace, producer to promotion"
    assert park.parent.span_id == request_span.get_span_context().span_id
    assert promote.parent.span_id == park.context.span_id, "promotion continues from the park"
    assert promote.attributes["messaging.message.id"] == "traced"
    assert promote.attributes["messaging.destination.name"] == "emails"
    assert park.kind == promote.kind == trace.SpanKind.PRODUCER
    # The broker's publish happens inside the promote span: an instrumented publish carries it on.
    assert deliverer.seen["traced"].span_id == promote.context.span_id


def test_a_message_rewritten_by_a_reschedule_keeps_the_trace_it_was_parked_in(store: DelayStore, spans):
    # Celery's reschedule rewrites the stored message (its eta header); the dashboard doing it runs in a span
    # of its own, which must not take the promotion over.
    tracer = trace.get_tracer("producer-app")
    with tracer.start_as_current_span("handle request") as request_span:
        store.park("moved", Envelope(route="emails", payload=b"x"), delay=3600)
    stored = store.get("moved").envelope  # type: ignore[union-attr]
    assert stored is not None
    with tracer.start_as_current_span("dashboard: run now"):
        store.reschedule("moved", delay=0, envelope=stored)
    deliverer = Recording()
    promote_until(store, deliverer, lambda: "moved" in deliverer.seen)
    promote = next(span for span in spans.get_finished_spans() if span.name == "delay_broker promote")
    assert promote.context.trace_id == request_span.get_span_context().trace_id


def test_without_an_active_span_nothing_is_added_or_traced(store: DelayStore, spans):
    store.park("plain", Envelope(route="emails", payload=b"x"), delay=0)
    stored = store.get("plain").envelope  # type: ignore[union-attr]
    assert stored is not None and stored.extra == {}
    deliverer = Recording()
    promote_until(store, deliverer, lambda: "plain" in deliverer.seen)
    assert spans.get_finished_spans() == ()
    assert not deliverer.seen["plain"].is_valid


def test_a_spoiled_stored_context_is_ignored_not_fatal(store: DelayStore, spans):
    spoiled = Envelope(route="emails", payload=b"x", extra={CARRIER_KEY: {"traceparent": 42, "x": ["y"]}})
    store.park("spoiled", spoiled, delay=0)
    deliverer = Recording()
    promoter = promote_until(store, deliverer, lambda: "spoiled" in deliverer.seen)
    assert promoter.counters.errors == 0 and promoter.counters.promoted == 1


def test_the_exactly_once_path_records_a_promote_span_in_each_parked_trace(store: DelayStore, client, spans):
    from delay_broker.deliverers import DirectLists
    from delay_broker.targets import ListTarget

    tracer = trace.get_tracer("producer-app")
    contexts = {}
    for n in range(3):
        with tracer.start_as_current_span(f"request {n}") as request_span:
            store.park(f"direct-{n}", Envelope(route="ready", payload=b"x"), delay=0)
            contexts[f"direct-{n}"] = request_span.get_span_context()
    store.park("untraced", Envelope(route="ready", payload=b"x"), delay=0)
    ready = f"{store.keys.namespace}:ready"
    promote_until(store, DirectLists({"ready": ListTarget(ready)}), lambda: client.llen(ready) == 4)
    finished = spans.get_finished_spans()
    parks = {span.parent.span_id: span for span in finished if span.name == "delay_broker park"}
    promotes = {
        span.attributes["messaging.message.id"]: span for span in finished if span.name == "delay_broker promote"
    }
    assert set(promotes) == set(contexts), "one span per traced message, none for the untraced one"
    for id, producer in contexts.items():
        park = parks[producer.span_id]
        assert promotes[id].context.trace_id == producer.trace_id
        assert promotes[id].parent.span_id == park.context.span_id
        assert promotes[id].end_time >= promotes[id].start_time
