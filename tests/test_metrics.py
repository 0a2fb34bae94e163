"""Prometheus metrics over real HTTP: promoter counters, and the store's backlog read at scrape time."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from delay_broker import ClaimedMessage, DelayStore, Envelope, ListTarget, ParkRequest, Promoter, TargetUnavailable
from delay_broker.deliverers import DirectLists
from delay_broker.embedded import free_port
from delay_broker.metrics import PromoterMetrics, StoreCollector, start_metrics_server
from delay_broker.once import Executions

from .helpers import wait_for

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[str, Samples]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


class Unavailable:
    """An at-least-once deliverer whose broker is down."""

    def deliver(self, message: ClaimedMessage) -> None:
        raise TargetUnavailable("broker down")


def test_one_scrape_shows_promoter_counters_and_the_store_backlog(store: DelayStore, client, namespace):
    ready = f"{namespace}:jobs:ready"
    registry = CollectorRegistry()
    listener = PromoterMetrics.for_store(store, registry)
    for n in range(3):
        store.park(f"job-{n}", Envelope(route="ready", payload=b"x"), delay=0)
    store.park("stray", Envelope(route="undeclared", payload=b"x"), delay=0)  # dead-lettered: unknown route
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready)}), listener=listener, max_idle=0.5).start()
    try:
        wait_for(lambda: client.llen(ready) == 3 and store.stats().dead == 1)
    finally:
        promoter.stop()
    # What is left: one in flight (claimed, not acknowledged), one overdue by ~90 s, one due within a
    # minute, one due tomorrow.
    store.park("claimed", Envelope(route="ready", payload=b"x"), delay=0)
    assert [m.id for m in store.claim(10, 60, "metrics-test").messages] == ["claimed"]
    overdue_due = datetime.now(timezone.utc) - timedelta(seconds=90)
    store.park("late", Envelope(route="ready", payload=b"x"), due=overdue_due)
    store.park("soon", Envelope(route="ready", payload=b"x"), delay=30)
    store.park("tomorrow", Envelope(route="ready", payload=b"x"), delay=26 * 3600)

    listener.missed("nightly", 2)  # a recurring schedule's skipped occurrences (test_runtime_schedules makes some)
    executions = Executions(store, metrics=True, registry=registry)  # effectively once: a second delivery dropped
    executions.end(executions.begin("ran", "1795000000000", 0), succeeded=True)
    assert not executions.begin("ran", "1795000000000", 0).runs
    with start_metrics_server(0, store, registry, addr="127.0.0.1") as server:
        assert server.port > 0
        _, samples = scrape(server.url)
    ns = {"namespace": namespace}
    assert value(samples, "delay_broker_schedule_missed_occurrences_total", schedule="nightly", **ns) == 2
    assert value(samples, "delay_broker_duplicates_dropped_total", **ns) == 1
    assert value(samples, "delay_broker_store_events_total", event="duplicates_dropped", **ns) == 1
    # Promoter side.
    assert value(samples, "delay_broker_promoted_total", **ns) == 3
    assert value(samples, "delay_broker_dead_lettered_total", **ns) == 1
    assert value(samples, "delay_broker_promotion_lateness_seconds_count", **ns) == 3
    assert value(samples, "delay_broker_promotion_lateness_seconds_bucket", le="+Inf", **ns) == 3
    assert value(samples, "delay_broker_promotion_lateness_seconds_sum", **ns) < 3
    for stage in ("redis", "target", "internal"):
        assert value(samples, "delay_broker_promoter_errors_total", stage=stage, **ns) == 0
    # Store side, read at scrape time.
    assert value(samples, "delay_broker_store_up", **ns) == 1
    assert value(samples, "delay_broker_parked_messages", **ns) == 3
    assert value(samples, "delay_broker_inflight_messages", **ns) == 1
    assert value(samples, "delay_broker_dead_messages", **ns) == 1
    assert value(samples, "delay_broker_overdue_messages", **ns) == 1
    assert 89 <= value(samples, "delay_broker_oldest_overdue_age_seconds", **ns) < 100
    assert value(samples, "delay_broker_live_promoters", **ns) == 1  # the claim's heartbeat; the promoter left
    assert value(samples, "delay_broker_next_due_timestamp_seconds", **ns) == pytest.approx(
        overdue_due.timestamp(), abs=0.01
    )
    by_due = {
        due: value(samples, "delay_broker_parked_by_due_messages", due=due, **ns)
        for due in ("overdue", "1m", "1h", "1d", "later")
    }
    assert by_due == {"overdue": 1, "1m": 1, "1h": 0, "1d": 0, "later": 1}
    assert value(samples, "delay_broker_store_events_total", event="promoted", **ns) == 3
    assert value(samples, "delay_broker_store_events_total", event="dead_lettered", **ns) == 1
    assert value(samples, "delay_broker_store_events_total", event="parked", **ns) == 8
    # Every metric name the operations guide documents is exposed.
    documented = set(re.findall(r"`(delay_broker_[a-z_]+)", DOCS.read_text()))
    assert len(documented) >= 14
    exposed = {name for name, _ in samples}
    missing = {name for name in documented if name not in exposed and f"{name}_count" not in exposed}
    assert not missing, f"documented but not exposed: {missing}"


def test_the_backlog_is_exposed_with_no_promoter_and_an_empty_store(store: DelayStore, namespace):
    registry = CollectorRegistry()
    with start_metrics_server(0, store, registry, addr="127.0.0.1") as server:
        _, samples = scrape(server.url)
    ns = {"namespace": namespace}
    assert value(samples, "delay_broker_parked_messages", **ns) == 0
    assert value(samples, "delay_broker_live_promoters", **ns) == 0
    assert value(samples, "delay_broker_oldest_overdue_age_seconds", **ns) == 0
    assert ("delay_broker_next_due_timestamp_seconds", frozenset(ns.items())) not in samples
    assert not any(name.startswith("delay_broker_promoted") for name, _ in samples)  # no promoter here
    assert value(samples, "delay_broker_packed_messages", **ns) == 0
    for event in (
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
    ):
        # At 0 from the first scrape: increase() needs a first sample before the first dead letter.
        assert value(samples, "delay_broker_store_events_total", event=event, **ns) == 0, event


def test_the_metrics_server_serves_on_ipv6(store: DelayStore, namespace):
    with start_metrics_server(0, store, CollectorRegistry(), addr="::1") as server:
        assert server.url == f"http://[::1]:{server.port}/metrics"
        with urllib.request.urlopen(server.url, timeout=5) as reply:
            assert f'delay_broker_store_up{{namespace="{namespace}"}} 1.0' in reply.read().decode()


def test_errors_are_counted_by_stage(store: DelayStore, namespace):
    registry = CollectorRegistry()
    listener = PromoterMetrics.for_store(store, registry)
    store.park("job", Envelope(route="ready", payload=b"x"), delay=0)
    Promoter(store, Unavailable(), listener=listener, lease=5).step()
    down = DelayStore.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace=namespace, socket_connect_timeout=0.5)
    Promoter(down, Unavailable(), listener=PromoterMetrics.for_store(down, registry)).step()
    ns = {"namespace": namespace}
    assert registry.get_sample_value("delay_broker_promoter_errors_total", {**ns, "stage": "target"}) == 1
    assert registry.get_sample_value("delay_broker_promoter_errors_total", {**ns, "stage": "redis"}) == 1
    assert registry.get_sample_value("delay_broker_promoter_errors_total", {**ns, "stage": "internal"}) == 0
    assert store.get("job").state == "due"  # given back without an attempt


def test_an_unreachable_store_scrapes_as_down_instead_of_failing(store: DelayStore, namespace):
    down = DelayStore.from_url(
        f"redis://127.0.0.1:{free_port()}/0", namespace=f"{namespace}-down", socket_connect_timeout=0.5
    )
    registry = CollectorRegistry()
    with start_metrics_server(0, [store, down], registry, addr="127.0.0.1") as server:
        _, samples = scrape(server.url)
    assert value(samples, "delay_broker_store_up", namespace=namespace) == 1
    assert value(samples, "delay_broker_store_up", namespace=f"{namespace}-down") == 0
    assert ("delay_broker_parked_messages", frozenset({("namespace", f"{namespace}-down")})) not in samples


def test_listeners_of_several_namespaces_share_one_registry(store: DelayStore):
    registry = CollectorRegistry()
    first, second = PromoterMetrics("a", registry), PromoterMetrics("b", registry)
    first.promoted([5, 2_000])
    second.promoted([1])
    second.dead_lettered(2)
    first.failed("surprise")
    assert registry.get_sample_value("delay_broker_promoted_total", {"namespace": "a"}) == 2
    assert registry.get_sample_value("delay_broker_promoted_total", {"namespace": "b"}) == 1
    assert registry.get_sample_value("delay_broker_dead_lettered_total", {"namespace": "b"}) == 2
    assert (
        registry.get_sample_value("delay_broker_promotion_lateness_seconds_bucket", {"namespace": "a", "le": "0.005"})
        == 1
    )
    assert (
        registry.get_sample_value("delay_broker_promotion_lateness_seconds_bucket", {"namespace": "a", "le": "2.5"})
        == 2
    )
    assert registry.get_sample_value("delay_broker_promoter_errors_total", {"namespace": "a", "stage": "surprise"}) == 1
    with pytest.raises(ValueError):
        StoreCollector([store, store])


def test_stopping_the_server_frees_the_port_and_the_registry(store: DelayStore):
    registry = CollectorRegistry()
    server = start_metrics_server(0, store, registry, addr="127.0.0.1")
    port = server.port
    server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)
    # The collector is off the registry: a new one for the same store can be registered.
    start_metrics_server(port, store, registry, addr="127.0.0.1").stop()


def test_the_core_and_the_cli_import_without_prometheus_client():
    code = (
        "import sys, delay_broker, delay_broker.metrics, delay_broker.cli, delay_broker.cli.app; "
        "assert 'prometheus_client' not in sys.modules, 'imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_promoter_logs_state_changes_and_dead_letters_but_nothing_per_message(store, client, namespace, caplog):
    ready = f"{namespace}:jobs:ready"
    store.park_many(
        [ParkRequest(f"job-{n}", Envelope(route="ready", payload=b"x"), delay=0) for n in range(50)]
        + [ParkRequest("stray", Envelope(route="undeclared", payload=b"x"), delay=0)]
    )
    with caplog.at_level(logging.DEBUG, logger="delay_broker"):
        promoter = Promoter(store, DirectLists({"ready": ListTarget(ready)}), max_idle=0.5).start()
        try:
            wait_for(lambda: client.llen(ready) == 50 and store.stats().dead == 1)
        finally:
            promoter.stop()
    lines = [
        (record.levelname, record.getMessage()) for record in caplog.records if record.name.startswith("delay_broker")
    ]
    assert ("INFO", f"Promoter {promoter.id} started on delay_broker:{{{namespace}}}:* (exactly-once).") in lines
    assert ("INFO", f"Promoter {promoter.id} stopped.") in lines
    assert any(level == "WARNING" and "dead-lettered 1 message(s): unknown route" in text for level, text in lines)
    assert len([line for line in lines if line[0] == "INFO"]) == 2  # nothing per promoted message


class Delivered:
    """An at-least-once deliverer whose broker takes everything."""

    def deliver(self, message: ClaimedMessage) -> None:
        pass


@pytest.mark.parametrize("path", ["exactly-once", "at-least-once"])
def test_promotions_are_counted_per_queue_and_task_name_with_a_bounded_label_set(
    store: DelayStore, namespace, path, monkeypatch
):
    import delay_broker.metrics as metrics

    monkeypatch.setattr(metrics, "MAX_TASKS", 3)
    registry = CollectorRegistry()
    listener = PromoterMetrics.for_store(store, registry)
    sent = [("emails", "send_welcome")] * 3 + [("emails", "send_digest"), ("reports", "build")] + [("reports", None)]
    sent += [("reports", f"generated_{n}") for n in range(4)]  # past the bound of names
    for n, (queue, task) in enumerate(sent):
        store.park(f"m{n}", Envelope(route=queue, name=task, payload=b"x"), delay=0)
    targets = {queue: ListTarget(f"{namespace}:{queue}") for queue in ("emails", "reports")}
    deliverer = DirectLists(targets) if path == "exactly-once" else Delivered()
    promoter = Promoter(store, deliverer, listener=listener, max_idle=0.5).start()
    try:
        wait_for(lambda: promoter.counters.promoted == len(sent))
    finally:
        promoter.stop()
    counts = {
        (sample.labels["queue"], sample.labels["task"]): sample.value
        for family in registry.collect()
        if family.name == "delay_broker_promoted_by_task"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["namespace"] == namespace
    }
    assert sum(counts.values()) == len(sent)
    assert counts[("emails", "send_welcome")] == 3 and counts[("emails", "send_digest")] == 1
    assert len({task for _, task in counts}) <= 4, "three names of their own, the rest as 'other'"
    assert counts.get(("reports", "other"), 0) >= 4
