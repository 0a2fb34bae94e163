"""Prometheus metrics: what promoters do, and what the store holds, read at scrape time.

Needs the ``prometheus`` extra (``pip install 'delay-broker[prometheus]'``). ``prometheus_client`` is imported
only when a metric object is made, so the core works without it, and so that a process that turns on
``prometheus_client``'s multiprocess mode (as Dramatiq's ``Prometheus`` middleware does, through
``PROMETHEUS_MULTIPROC_DIR``) before making its metrics gets the promoter counters in the shared files.

Two parts:

- :class:`PromoterMetrics`, a :class:`~delay_broker.reports.PromoterListener`: counters and a histogram
  updated by a promoter as it works (``delay_broker_promoted_total``, ``delay_broker_promotion_lateness_seconds``,
  ``delay_broker_promoter_errors_total``, ``delay_broker_dead_lettered_total``).
- :class:`StoreCollector`: reads :meth:`DelayStore.stats` when Prometheus scrapes, so one scrape shows the
  backlog (parked, in flight, dead, overdue, oldest-overdue age, live promoters) even when no promoter of this
  process runs.

:func:`start_metrics_server` serves both over HTTP. Every metric has a ``namespace`` label (the store's
namespace). The README (Operations) lists them all with alerting rules.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from socketserver import ThreadingMixIn
from types import ModuleType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .connect import describe as describe_client
from .errors import ConfigurationError
from .reports import BasicListener, PromoterListener, as_listener
from .store import DelayStore, StoreStats

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

logger = logging.getLogger("delay_broker.metrics")

PREFIX = "delay_broker"
STORE_EVENTS = (
    "parked",
    "replaced",
    "promoted",
    "dead_lettered",
    "dead_dropped",
    "retried",
    "cancelled",
    "requeued",
    "opened",
    "pack_damaged",
    "duplicates_dropped",
)
"""The store-wide counters :class:`StoreCollector` exposes (``delay_broker_store_events_total``)."""

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Seconds between a message's due time and its promotion."""

STAGES = ("redis", "target", "configuration", "internal")
"""Where a promoter cycle can fail: the store's Redis, the target broker, a configuration that cannot work (such
as a malformed shard count), anything else (a bug)."""

MAX_QUEUES = 100
MAX_TASKS = 500
"""Label values of ``delay_broker_promoted_by_task_total`` a process keeps apart; more are folded into
``other``, so a producer parking under ever new names cannot grow the metric without bound."""
OTHER = "other"

DUE_BUCKETS = ("overdue", "1m", "1h", "1d", "later")
"""``due`` label values of ``delay_broker_parked_by_due_messages``: overdue, due within a minute (not overdue),
within an hour (after the first minute), within a day, later."""


def prometheus() -> ModuleType:
    """The ``prometheus_client`` module, or a :class:`ConfigurationError` saying how to install it."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "Prometheus metrics need the 'prometheus' extra: pip install 'delay-broker[prometheus]'"
        ) from None
    return prometheus_client


def default_registry() -> CollectorRegistry:
    registry: CollectorRegistry = prometheus().REGISTRY
    return registry


# -- promoter side ---------------------------------------------------------------------------------------------


class _PromoterFamilies:
    """The promoter metric families of one registry (shared by every listener registered there)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        prom = prometheus()
        self.queues: set[str] = set()
        self.tasks: set[str] = set()
        self.promoted = prom.Counter(
            f"{PREFIX}_promoted",
            "Messages promoted (handed back to their queue) by promoters of this process.",
            ["namespace"],
            registry=registry,
        )
        self.lateness = prom.Histogram(
            f"{PREFIX}_promotion_lateness_seconds",
            "Seconds from a message's due time to its promotion.",
            ["namespace"],
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self.errors = prom.Counter(
            f"{PREFIX}_promoter_errors",
            "Failed promoter cycles by stage: redis (store unreachable), target (broker unreachable), internal.",
            ["namespace", "stage"],
            registry=registry,
        )
        self.dead_lettered = prom.Counter(
            f"{PREFIX}_dead_lettered",
            "Messages dead-lettered by promoters of this process (undeliverable, unknown route, out of attempts).",
            ["namespace"],
            registry=registry,
        )
        self.by_task = prom.Counter(
            f"{PREFIX}_promoted_by_task",
            "Messages promoted by promoters of this process, per queue and actor or task name (at most "
            f"{MAX_QUEUES} queues and {MAX_TASKS} names per process; the rest are counted as 'other').",
            ["namespace", "queue", "task"],
            registry=registry,
        )
        self.missed = prom.Counter(
            f"{PREFIX}_schedule_missed_occurrences",
            "Occurrences of recurring schedules skipped because no promoter ran them within a minute of their time.",
            ["namespace", "schedule"],
            registry=registry,
        )

    def bounded(self, queue: str, task: str) -> tuple[str, str]:
        """The label values for a queue and task name: themselves, or ``other`` past the per-process bound."""
        with _families_lock:
            if queue not in self.queues and len(self.queues) < MAX_QUEUES:
                self.queues.add(queue)
            if task not in self.tasks and len(self.tasks) < MAX_TASKS:
                self.tasks.add(task)
        return (queue if queue in self.queues else OTHER, task if task in self.tasks else OTHER)


_families: weakref.WeakKeyDictionary[CollectorRegistry, _PromoterFamilies] = weakref.WeakKeyDictionary()
_families_lock = threading.Lock()


def _families_of(registry: CollectorRegistry) -> _PromoterFamilies:
    with _families_lock:
        families = _families.get(registry)
        if families is None:
            families = _families[registry] = _PromoterFamilies(registry)
        return families


class PromoterMetrics(PromoterListener):
    """A :class:`~delay_broker.reports.PromoterListener` that counts what a promoter does.

    Give it to a promoter: ``Promoter(store, deliverer, listener=PromoterMetrics.for_store(store))``. Any
    number of listeners (one per promoter or namespace) may share one registry (default: prometheus_client's
    global ``REGISTRY``); they share the metric families and differ by their ``namespace`` label.
    """

    def __init__(self, namespace: str = "default", registry: CollectorRegistry | None = None) -> None:
        families = _families_of(registry if registry is not None else default_registry())
        self.namespace = namespace
        self._families = families
        self._promoted = families.promoted.labels(namespace=namespace)
        self._lateness = families.lateness.labels(namespace=namespace)
        self._dead = families.dead_lettered.labels(namespace=namespace)
        # Made up front so that every stage shows as 0 before its first error (rate() needs a first sample).
        self._errors = {stage: families.errors.labels(namespace=namespace, stage=stage) for stage in STAGES}

    @classmethod
    def for_store(cls, store: DelayStore, registry: CollectorRegistry | None = None) -> PromoterMetrics:
        return cls(store.keys.namespace, registry)

    def promoted(self, lateness_ms: Sequence[int]) -> None:
        if not lateness_ms:
            return
        self._promoted.inc(len(lateness_ms))
        for value in lateness_ms:
            self._lateness.observe(max(0, value) / 1000.0)

    def dead_lettered(self, count: int) -> None:
        if count > 0:
            self._dead.inc(count)

    def failed(self, stage: str) -> None:
        counter = self._errors.get(stage)
        if counter is None:
            counter = self._families.errors.labels(namespace=self.namespace, stage=stage)
        counter.inc()

    def promoted_by_task(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Promotions per queue and name, with a bounded label set (see :data:`MAX_QUEUES`)."""
        for (queue, task), count in counts.items():
            labels = self._families.bounded(queue, task or "-")
            self._families.by_task.labels(namespace=self.namespace, queue=labels[0], task=labels[1]).inc(count)

    def missed(self, schedule: str, count: int) -> None:
        """Occurrences of a recurring schedule skipped (a bounded label set: one per schedule)."""
        if count > 0:
            self._families.missed.labels(namespace=self.namespace, schedule=schedule).inc(count)


class ListenerChain(PromoterListener):
    """Several promoter listeners as one (e.g. an application's own listener and :class:`PromoterMetrics`).
    Listeners that are no :class:`PromoterListener` are taken as a promoter takes them (see
    :func:`~delay_broker.reports.as_listener`)."""

    def __init__(self, *listeners: BasicListener | None) -> None:
        self.listeners = [listener for listener in listeners if listener is not None]
        self._chain = [as_listener(listener) for listener in self.listeners]

    def promoted(self, lateness_ms: Sequence[int]) -> None:
        for listener in self._chain:
            listener.promoted(lateness_ms)

    def dead_lettered(self, count: int) -> None:
        for listener in self._chain:
            listener.dead_lettered(count)

    def failed(self, stage: str) -> None:
        for listener in self._chain:
            listener.failed(stage)

    def promoted_by_task(self, counts: Mapping[tuple[str, str], int]) -> None:
        for listener in self._chain:
            listener.promoted_by_task(counts)

    def missed(self, schedule: str, count: int) -> None:
        for listener in self._chain:
            listener.missed(schedule, count)


# -- store side ----------------------------------------------------------------------------------------------------

_GAUGES: tuple[tuple[str, str], ...] = (
    ("parked_messages", "Messages parked (waiting for their due time or overdue), i.e. the store's depth."),
    ("packed_messages", "Of the parked messages, those kept in packs (due at least pack_after ahead when parked)."),
    ("inflight_messages", "Messages claimed by an at-least-once promoter and not yet acknowledged."),
    ("dead_messages", "Dead-lettered messages (see: delay-broker dead ls)."),
    ("overdue_messages", "Parked messages whose due time has passed (not yet promoted)."),
    ("oldest_overdue_age_seconds", "Seconds since the due time of the oldest overdue message; 0 when none."),
    ("live_promoters", "Promoters that sent a heartbeat within the heartbeat window (30 s)."),
)


class StoreCollector:
    """A Prometheus collector that reads :meth:`DelayStore.stats` of one or more stores at scrape time.

    If a store's Redis cannot be read, ``delay_broker_store_up`` is 0 for its namespace and its other
    metrics are left out of that scrape (the scrape itself still succeeds).
    """

    def __init__(self, stores: DelayStore | Sequence[DelayStore], *, heartbeat_window: float = 30.0) -> None:
        self.stores = [stores] if isinstance(stores, DelayStore) else list(stores)
        namespaces = [store.keys.namespace for store in self.stores]
        if len(set(namespaces)) != len(namespaces):
            raise ValueError(f"one collector per namespace: {namespaces} repeats one")
        self.heartbeat_window = heartbeat_window
        self._down: set[str] = set()

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        results: dict[str, StoreStats | None] = {}
        for store in self.stores:
            namespace = store.keys.namespace
            try:
                results[namespace] = store.stats(self.heartbeat_window)
            except Exception as error:  # a scrape must not fail because one store is unreachable
                results[namespace] = None
                if namespace not in self._down:
                    self._down.add(namespace)
                    logger.warning(
                        "Metrics: cannot read namespace %r at %s (delay_broker_store_up is 0 until it answers): %s",
                        namespace,
                        describe_client(store.client),
                        error,
                    )
                continue
            if namespace in self._down:
                self._down.discard(namespace)
                logger.info("Metrics: stats of namespace %r readable again.", namespace)
        return self._families(results)

    def _families(self, results: dict[str, StoreStats | None]) -> list[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily(
            f"{PREFIX}_store_up", "1 if the store's Redis answered this scrape, else 0.", labels=["namespace"]
        )
        gauges = {name: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["namespace"]) for name, doc in _GAUGES}
        next_due = GaugeMetricFamily(
            f"{PREFIX}_next_due_timestamp_seconds",
            "Unix time of the earliest due time among parked messages (absent when none is parked).",
            labels=["namespace"],
        )
        by_due = GaugeMetricFamily(
            f"{PREFIX}_parked_by_due_messages",
            "Parked messages by due time: overdue, within 1m, 1m-1h, 1h-1d, later.",
            labels=["namespace", "due"],
        )
        events = CounterMetricFamily(
            f"{PREFIX}_store_events",
            "Store-wide event counters kept in Redis (all promoters and producers): " + ", ".join(STORE_EVENTS) + ".",
            labels=["namespace", "event"],
        )
        for namespace, stats in results.items():
            up.add_metric([namespace], 0 if stats is None else 1)
            if stats is None:
                continue
            values = {
                "parked_messages": stats.parked,
                "packed_messages": stats.packed,
                "inflight_messages": stats.inflight,
                "dead_messages": stats.dead,
                "overdue_messages": stats.overdue,
                "oldest_overdue_age_seconds": stats.oldest_overdue_age_ms / 1000.0,
                "live_promoters": stats.live_promoters,
            }
            for name, value in values.items():
                gauges[name].add_metric([namespace], value)
            if stats.next_due_ms is not None:
                next_due.add_metric([namespace], stats.next_due_ms / 1000.0)
            counts = [stats.overdue, *stats.histogram]
            if len(counts) == len(DUE_BUCKETS):
                for label, count in zip(DUE_BUCKETS, counts, strict=True):
                    by_due.add_metric([namespace, label], count)
            # Every documented event from the first scrape, at 0 until it happens: increase() over a series that
            # first appears at 50 sees no increase, and an alert on the first dead letters would stay silent.
            for event, total in sorted({**dict.fromkeys(STORE_EVENTS, 0), **stats.counters}.items()):
                events.add_metric([namespace, event], total)
        return [up, *gauges.values(), next_due, by_due, events]


# -- exposition -----------------------------------------------------------------------------------------------------


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingWSGIServerV6(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


def _server_class(addr: str, port: int) -> type[_ThreadingWSGIServer]:
    """The server class for ``addr``'s address family: ``::1`` or ``::`` need an IPv6 socket."""
    families = {info[0] for info in socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM)}
    return (
        _ThreadingWSGIServerV6
        if socket.AF_INET6 in families and socket.AF_INET not in families
        else _ThreadingWSGIServer
    )


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log: Prometheus scrapes every few seconds."""


class MetricsServer:
    """An HTTP exposition endpoint running in a daemon thread (``/metrics``, any path in fact)."""

    def __init__(
        self,
        server: WSGIServer,
        thread: threading.Thread,
        registry: CollectorRegistry,
        collector: StoreCollector | None,
    ) -> None:
        self.server = server
        self.thread = thread
        self.registry = registry
        self.collector = collector

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(str(self.server.server_address[0]))
        host = host or str(self.server.server_address[0])
        return f"http://[{host}]:{self.port}/metrics" if ":" in host else f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving, close the socket, and take the store collector off the registry."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        if self.collector is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(self.collector)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_metrics_server(
    port: int,
    store: DelayStore | Sequence[DelayStore] | None = None,
    registry: CollectorRegistry | None = None,
    *,
    addr: str = "0.0.0.0",
    heartbeat_window: float = 30.0,
) -> MetricsServer:
    """Serve ``registry`` (default: prometheus_client's global ``REGISTRY``) over HTTP on ``addr:port``.

    With ``store`` (one or several), a :class:`StoreCollector` for it is registered first, so the endpoint
    shows the backlog. ``port=0`` picks a free port (read it from the result's ``.port``). The server runs in
    a daemon thread; ``.stop()`` ends it.
    """
    prom = prometheus()
    if registry is None:
        registry = default_registry()
    collector = None
    if store is not None:
        collector = StoreCollector(store, heartbeat_window=heartbeat_window)
        registry.register(collector)
    try:
        app = prom.make_wsgi_app(registry)
        server = make_server(addr, port, app, _server_class(addr, port), handler_class=_SilentHandler)
    except BaseException:
        if collector is not None:
            registry.unregister(collector)
        raise
    # A short poll interval makes stop() quick; an idle server costs ten wake-ups a second.
    serve = functools.partial(server.serve_forever, poll_interval=0.1)
    thread = threading.Thread(target=serve, name=f"delay-broker-metrics-{server.server_port}", daemon=True)
    thread.start()
    result = MetricsServer(server, thread, registry, collector)
    logger.info("Serving Prometheus metrics on %s", result.url)
    return result


__all__ = [
    "LATENESS_BUCKETS",
    "ListenerChain",
    "MetricsServer",
    "PromoterMetrics",
    "StoreCollector",
    "start_metrics_server",
]
