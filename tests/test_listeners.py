"""Promoter listeners: the base class with no-op methods, and listeners written before it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from prometheus_client import CollectorRegistry

from delay_broker import ClaimedMessage, DelayStore, ListTarget, ParkRequest, Promoter, TargetUnavailable
from delay_broker.deliverers import DirectLists
from delay_broker.embedded import free_port
from delay_broker.metrics import ListenerChain, PromoterMetrics
from delay_broker.promoter import PromoterListener
from delay_broker.reports import as_listener

from .helpers import envelope


class WrittenBefore:
    """A listener as the README described it before the base class: the three basic methods only. Looks of
    any other attribute are counted (a promoter must look once, not at every call)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, object]] = []
        self.looked_up: Counter[str] = Counter()

    def __getattr__(self, name: str) -> object:
        self.looked_up[name] += 1
        raise AttributeError(name)

    def promoted(self, lateness_ms: Sequence[int]) -> None:
        self.heard.append(("promoted", len(lateness_ms)))

    def dead_lettered(self, count: int) -> None:
        self.heard.append(("dead_lettered", count))

    def failed(self, stage: str) -> None:
        self.heard.append(("failed", stage))


class Unavailable:
    def deliver(self, message: ClaimedMessage) -> None:
        raise TargetUnavailable("broker down")


def park_due(store: DelayStore, ids: Sequence[str], route: str = "ready") -> None:
    store.park_many([ParkRequest(id, envelope(id.encode(), route=route), delay=0) for id in ids])


def test_a_listener_written_before_the_base_class_hears_the_promoter_and_is_looked_at_once(store, ready_key):
    listener = WrittenBefore()
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready_key)}), listener=listener, max_idle=0.1)
    for round in range(3):
        park_due(store, [f"job-{round}-{n}" for n in range(2)])
        park_due(store, [f"lost-{round}"], route="nowhere")  # no such route: dead-lettered
        promoter.step()
    assert listener.heard == [("promoted", 2), ("dead_lettered", 1)] * 3
    # promoted_by_task and missed looked up once, when the promoter took the listener; never per call.
    assert listener.looked_up == Counter({"promoted_by_task": 1, "missed": 1})
    assert promoter.listener is listener, "the listener given, as given"


def test_a_listener_set_on_a_running_promoter_is_taken_the_same_way(store):
    promoter = Promoter(store, Unavailable(), lease=5)
    listener = WrittenBefore()
    promoter.listener = listener
    park_due(store, ["job"])
    promoter.step()
    assert listener.heard == [("failed", "target")]
    promoter.listener = None
    promoter.step()
    assert listener.heard == [("failed", "target")]


def test_a_subclass_overrides_only_what_it_needs(store, ready_key):
    class Failures(PromoterListener):
        def __init__(self) -> None:
            self.stages: list[str] = []

        def failed(self, stage: str) -> None:
            self.stages.append(stage)

    up = Failures()
    park_due(store, ["a", "b"])
    Promoter(store, DirectLists({"ready": ListTarget(ready_key)}), listener=up).step()
    assert up.stages == []
    down = DelayStore.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace="x", socket_connect_timeout=0.5)
    Promoter(down, DirectLists({"ready": ListTarget(ready_key)}), listener=up).step()
    assert up.stages == ["redis"]
    assert as_listener(up) is up and isinstance(as_listener(None), PromoterListener)


@pytest.mark.parametrize("listener", [object(), type("NoFailed", (), {"promoted": print, "dead_lettered": print})()])
def test_a_listener_without_the_basic_methods_is_refused_when_given(store, ready_key, listener):
    with pytest.raises(TypeError, match="a promoter listener needs"):
        Promoter(store, DirectLists({"ready": ListTarget(ready_key)}), listener=listener)
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready_key)}))
    with pytest.raises(TypeError, match="a promoter listener needs"):
        promoter.listener = listener


def test_a_chain_gives_each_listener_what_it_takes(store, ready_key, namespace):
    class ByTask(PromoterListener):
        def __init__(self) -> None:
            self.counts: Counter[tuple[str, str]] = Counter()

        def promoted_by_task(self, counts: Mapping[tuple[str, str], int]) -> None:
            self.counts.update(counts)

    before, by_task, registry = WrittenBefore(), ByTask(), CollectorRegistry()
    chain = ListenerChain(before, None, by_task, PromoterMetrics.for_store(store, registry))
    park_due(store, ["a", "b", "c"])
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready_key)}), listener=chain)
    promoter.step()
    assert before.heard == [("promoted", 3)]
    assert by_task.counts == Counter({("ready", ""): 3})
    assert registry.get_sample_value("delay_broker_promoted_total", {"namespace": namespace}) == 3
    chain.missed("nightly", 2)  # none of them but the metrics count misses: the others take it as a no-op
    labels = {"namespace": namespace, "schedule": "nightly"}
    assert registry.get_sample_value("delay_broker_schedule_missed_occurrences_total", labels) == 2
