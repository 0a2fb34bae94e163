"""A promoter in a Redis outage: one warning, waits that grow, one "reachable again" when Redis really answers."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from delay_broker import DelayStore, ListTarget, Promoter
from delay_broker.deliverers import DirectLists
from delay_broker.embedded import EmbeddedRedis

from .helpers import envelope, wait_for

UNAVAILABLE = "Redis unavailable"
REACHABLE = "Redis reachable again"


class CountingConnection(redis.Connection):
    """Notes the time of every call into a connection: redis-py connects (or finds the socket connected) before
    each command, so while the server is away every note is one attempt to reach it."""

    calls: list[float]
    lock = threading.Lock()

    def connect(self) -> None:
        with self.lock:
            self.calls.append(time.monotonic())
        super().connect()


def counting_store(server: EmbeddedRedis, namespace: str) -> tuple[DelayStore, list[float]]:
    calls: list[float] = []
    connection_class = type("Counting", (CountingConnection,), {"calls": calls})
    # No retries of redis-py's own: each attempt the promoter makes is one connection attempt.
    pool = redis.ConnectionPool(
        connection_class=connection_class,
        host="127.0.0.1",
        port=server.port,
        socket_timeout=5,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )
    return DelayStore(redis.Redis(connection_pool=pool), namespace=namespace), calls


def lines(records: list[logging.LogRecord], text: str) -> list[logging.LogRecord]:
    return [record for record in records if text in record.getMessage()]


@pytest.mark.parametrize("max_idle", [2.0, 30.0], ids=["outage-outlasts-max_idle", "outage-within-max_idle"])
def test_a_promoter_backs_off_in_a_redis_outage_and_says_so_once(namespace, caplog, max_idle):
    # As a new user meets it: one message parked an hour ahead, the promoter asleep until its next look, then
    # the redis-server SIGKILLed. The promoter used to take "no shard was due for a look" for "Redis answered":
    # it logged "reachable again", forgot its failures, and retried (and warned) ten times a second.
    caplog.set_level(logging.INFO, logger="delay_broker.promoter")
    outage = 5.0
    with EmbeddedRedis(["--appendonly", "yes", "--appendfsync", "always"]) as server:
        store, calls = counting_store(server, namespace)
        store.park("an-hour-ahead", envelope(), delay=3600)
        ready = f"{namespace}:ready"
        promoter = Promoter(store, DirectLists({"ready": ListTarget(ready)}), max_idle=max_idle).start()
        try:
            wait_for(lambda: promoter.counters.cycles >= 2, what="the promoter asleep")
            time.sleep(0.3)
            killed_at, killed_wall = time.monotonic(), time.time()
            server.stop(kill=True)
            time.sleep(outage)
            attempts = [at - killed_at for at in list(calls) if at >= killed_at]
            during = list(caplog.records)
            back_wall = time.time()
            server.start()
            store.park("after", envelope(b"after"), delay=0.2)
            # The promoter says it is back after the cycle that promoted: the list may be seen first.
            wait_for(
                lambda: server.client().llen(ready) == 1 and lines(caplog.records, REACHABLE),
                timeout=30,
                what="promoting again once Redis is back",
            )
            after = list(caplog.records)
        finally:
            promoter.stop()

    print(f"attempts after the kill (s): {[round(at, 3) for at in attempts]}")
    warnings = lines(during, UNAVAILABLE)
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].created >= killed_wall
    said = [record for record in during if record.levelno >= logging.WARNING and record.created >= killed_wall]
    assert said == warnings, "one warning for the outage, nothing else"
    assert lines(during, REACHABLE) == [], "Redis never answered during the outage"
    reachable = lines(after, REACHABLE)
    assert len(reachable) == 1 and reachable[0].created >= back_wall, "said once, when Redis answered"
    assert len(lines(after, UNAVAILABLE)) == 1

    # The waits grow: the k-th retry comes at least half of 0.1 * 2**k s after the one before (equal jitter),
    # whatever the speed of the machine. One attempt per retry: nothing is tried twice in one turn.
    assert attempts, "the promoter keeps trying"
    gaps = [attempts[0], *(b - a for a, b in itertools.pairwise(attempts))]
    for k, gap in enumerate(gaps):
        assert gap >= min(5.0, 0.05 * 2**k) * 0.95, f"wait {k + 1} was {gap:.3f} s: {gaps}"
    # Hence at most 7 attempts in 5 s (the shortest seven waits add up to 6.35 s); it used to make about 40.
    assert len(attempts) <= 7


def test_a_refused_wake_list_is_reported_once_and_backed_off_from(redis_server, namespace, caplog):
    # The same flaw, without an outage: the sleep's BLPOP refused (a string at the wake key) while nothing was
    # due for a look made a traceback and a "promoting again" line every 50-100 ms (52 of each in 4 s).
    caplog.set_level(logging.INFO, logger="delay_broker.promoter")
    client = redis_server.client()
    store = DelayStore(client, namespace=namespace)
    store.park("an-hour-ahead", envelope(), delay=3600)
    client.delete(store.keys.wake)
    client.set(store.keys.wake, "not a list")
    ready = f"{namespace}:ready"
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready)}), max_idle=30).start()
    try:
        wait_for(lambda: promoter.counters.errors >= 5, what="the sleep failing again and again")
        assert len(lines(caplog.records, "unexpected error while sleeping")) == 1
        assert lines(caplog.records, "promoting again") == []
        client.delete(store.keys.wake)
        store.park("after", envelope(b"after"), delay=0.2)  # its wake ends the first sleep that works
        wait_for(lambda: client.llen(ready) == 1, timeout=20, what="promoted")
    finally:
        promoter.stop()
        client.delete(ready, *store.keys.all())
    assert len(lines(caplog.records, "promoting again")) == 1
    assert len(lines(caplog.records, "unexpected error while sleeping")) == 1
