"""The promoter loop on a real redis-server: threads, processes, kill -9, restarts, sleeping and waking."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from delay_broker import (
    ClaimedMessage,
    DelayStore,
    DeliveryRefused,
    ListTarget,
    ParkRequest,
    Promoter,
    StoreFull,
    StoreUnavailable,
    TargetUnavailable,
)
from delay_broker.deliverers import DirectLists, ListDeliverer
from delay_broker.embedded import EmbeddedRedis

from .helpers import envelope, wait_for

ROOT = Path(__file__).resolve().parents[1]


def direct(ready_key: str, mode: str = "rpush") -> DirectLists:
    return DirectLists({"ready": ListTarget(ready_key, mode=mode)})  # type: ignore[arg-type]


def park_now(store: DelayStore, count: int, prefix: str = "job") -> list[str]:
    ids = [f"{prefix}-{n}" for n in range(count)]
    store.park_many([ParkRequest(id, envelope(id.encode()), delay=0) for id in ids])
    return ids


def drain(client: redis.Redis, key: str) -> Counter[str]:
    return Counter(item.decode() for item in client.lrange(key, 0, -1))


def test_promoter_thread_promotes_when_due(store, client, ready_key):
    promoter = Promoter(store, direct(ready_key), max_idle=1).start()
    try:
        store.park("later", envelope(b"later"), delay=2)
        time.sleep(0.2)
        assert client.llen(ready_key) == 0
        wait_for(lambda: client.llen(ready_key) == 1, timeout=5)
        assert client.lpop(ready_key) == b"later"
    finally:
        promoter.stop()
    assert not promoter.running


def test_backlog_drains_in_full_batches_without_sleeping(store, client, ready_key):
    park_now(store, 2500)
    promoter = Promoter(store, direct(ready_key), batch=100, max_idle=5)
    for _ in range(25):
        promoter.step()
    assert client.llen(ready_key) == 2500
    assert promoter.counters.cycles == 25


def test_at_least_once_delivery_with_retries_and_dead_letters(store, client, ready_key):
    failures: Counter[str] = Counter()

    class Flaky:
        def deliver(self, message: ClaimedMessage) -> None:
            assert message.envelope is not None
            if message.id == "refused":
                raise DeliveryRefused("queue was removed")
            if message.id == "flaky" and failures["flaky"] < 1:
                failures["flaky"] += 1
                raise RuntimeError("transient")
            client.rpush(ready_key, message.envelope.payload)

    store.park_many([ParkRequest(id, envelope(id.encode()), delay=0) for id in ("ok", "flaky", "refused")])
    client.hset(store.keys.msg, "corrupt", b"\xff\xfe not an envelope")
    client.zadd(store.keys.due, {"corrupt": 0})
    promoter = Promoter(store, Flaky(), max_idle=0.2).start()
    try:
        wait_for(lambda: client.llen(ready_key) == 2, timeout=10)
        wait_for(lambda: store.stats().dead == 2, timeout=10)
    finally:
        promoter.stop()
    assert sorted(drain(client, ready_key)) == ["flaky", "ok"]
    reasons = {info.id: info.error for info in store.list_messages("dead")}
    assert "queue was removed" in reasons["refused"]
    assert "malformed envelope" in reasons["corrupt"]
    assert promoter.running is False and store.stats().parked == 0


def test_target_outage_releases_the_batch_without_using_attempts(store, client, ready_key):
    down = threading.Event()
    down.set()

    class Outage:
        def deliver(self, message: ClaimedMessage) -> None:
            if down.is_set():
                raise TargetUnavailable("broker is down")
            client.rpush(ready_key, message.id)

    park_now(store, 20)
    promoter = Promoter(store, Outage(), max_idle=0.2).start()
    try:
        wait_for(lambda: promoter.counters.errors >= 4, timeout=10)
        assert store.stats().dead == 0
        assert all(info.attempts == 0 for info in store.list_messages("due"))
        down.clear()
        wait_for(lambda: client.llen(ready_key) == 20, timeout=15)
    finally:
        promoter.stop()
    assert store.stats().dead == 0


def test_graceful_stop_wakes_a_sleeping_promoter_at_once(store, ready_key):
    store.park("far", envelope(), delay=3600)
    promoter = Promoter(store, direct(ready_key), max_idle=30).start()
    time.sleep(0.3)
    started = time.monotonic()
    promoter.stop(timeout=10)
    assert not promoter.running
    assert time.monotonic() - started < 5, "stop must not wait out max_idle"
    assert store.stats().live_promoters == 0, "a stopped promoter removes its heartbeat"


def test_heartbeat_shows_live_promoters(store, ready_key):
    promoters = [Promoter(store, direct(ready_key), max_idle=0.5).start() for _ in range(3)]
    try:
        wait_for(lambda: store.stats().live_promoters == 3, timeout=5)
    finally:
        for promoter in promoters:
            promoter.stop()


def test_an_earlier_park_wakes_a_sleeping_promoter(store, client, ready_key):
    store.park("far", envelope(), delay=3600)
    promoter = Promoter(store, direct(ready_key), max_idle=20).start()
    try:
        time.sleep(0.5)  # asleep on the wake list, head one hour away
        started = time.monotonic()
        store.park("now", envelope(b"now"), delay=0)
        popped = client.blpop([ready_key], timeout=10)
        latency_ms = (time.monotonic() - started) * 1000
    finally:
        promoter.stop()
    assert popped is not None and popped[1] == b"now"
    print(f"wake latency: {latency_ms:.1f} ms")
    assert latency_ms < 2000, "woken by the park, not by max_idle (20 s)"


def test_a_short_socket_timeout_does_not_deafen_a_sleeping_promoter(redis_server, namespace, ready_key):
    # The store fits each BLPOP into the client's socket timeout (1.5 s here: 0.5 s turns); the promoter must
    # go on listening for the rest of its sleep, not sleep it locally.
    store = DelayStore(redis_server.client(socket_timeout=1.5), namespace=namespace)
    client = redis_server.client()
    promoter = Promoter(store, direct(ready_key), max_idle=10).start()
    try:
        store.park("later", envelope(b"later"), delay=6)
        time.sleep(1.2)  # asleep until "later" is due, past its first BLPOP turn
        parked = time.monotonic()
        store.park("now", envelope(b"now"), delay=0)
        wait_for(lambda: client.llen(ready_key) == 1, timeout=5)
        assert time.monotonic() - parked < 0.5, "woken by the park, not at the end of a local sleep"
    finally:
        promoter.stop()


def test_a_socket_timeout_of_a_second_does_not_make_the_sleep_a_busy_loop(namespace, ready_key):
    with EmbeddedRedis() as server:
        store = DelayStore(server.client(socket_timeout=1.0), namespace=namespace)
        store.park("later", envelope(b"later"), delay=3)
        promoter = Promoter(store, direct(ready_key), max_idle=10).start()
        try:
            wait_for(lambda: server.client().llen(ready_key) == 1, timeout=10)
        finally:
            promoter.stop()
        blpops = server.client().info("commandstats").get("cmdstat_blpop", {}).get("calls", 0)
        assert blpops <= 10, f"{blpops} BLPOPs in a 3 s sleep: half-second turns make about 6"


def test_a_promoter_with_no_route_yet_waits_without_errors_and_serves_routes_declared_later(store, client, ready_key):
    # A Dramatiq worker boots its promoter before any actor (and so any queue) is declared.
    deliverer = DirectLists({})
    promoter = Promoter(store, deliverer, max_idle=0.2).start()
    try:
        time.sleep(0.6)
        assert promoter.counters.errors == 0 and promoter.counters.cycles >= 2
        deliverer.routes["ready"] = ListTarget(ready_key)
        store.park("declared-later", envelope(b"late"), delay=0)
        popped = client.blpop([ready_key], timeout=5)
    finally:
        promoter.stop()
    assert popped is not None and popped[1] == b"late" and promoter.counters.errors == 0


def test_a_promoter_with_no_route_sleeps_its_max_idle_past_an_overdue_message(redis_server, namespace):
    client = redis_server.client()
    store = DelayStore(client, namespace=namespace)
    store.park("overdue", envelope(), delay=0)  # nothing may promote it until its route is declared
    promoter = Promoter(store, DirectLists({}), max_idle=1).start()
    try:
        time.sleep(0.5)
        cycles = promoter.counters.cycles
        time.sleep(2.5)
        cycles = promoter.counters.cycles - cycles
    finally:
        promoter.stop()
    assert cycles <= 4, f"{cycles} looks in 2.5 s: it spun on the overdue head"
    assert promoter.counters.errors == 0 and store.get("overdue") is not None


class FailsOnce:
    """A deliverer whose first delivery fails, and that notes when each attempt came."""

    def __init__(self) -> None:
        self.attempts: list[float] = []

    def deliver(self, message: ClaimedMessage) -> None:
        self.attempts.append(time.monotonic())
        if len(self.attempts) == 1:
            raise RuntimeError("broker hiccup")


class FailsWithAnUndecodableName:
    """Fails one message with an error whose text holds a lone surrogate, as os.listdir() names do."""

    def __init__(self) -> None:
        self.delivered: Counter[str] = Counter()

    def deliver(self, message: ClaimedMessage) -> None:
        self.delivered[message.id] += 1
        if message.id == "attach":
            raise FileNotFoundError("cannot attach " + b"report-\xff.pdf".decode(errors="surrogateescape"))


def test_an_error_text_that_is_not_utf8_neither_fails_nor_repeats_the_batch(redis_server, namespace):
    store = DelayStore(redis_server.client(), namespace=namespace, retry_backoff=(0.05, 0.1), max_attempts=2)
    deliverer = FailsWithAnUndecodableName()
    store.park_many([ParkRequest(id, envelope(), delay=0) for id in ("a", "attach", "b")])
    promoter = Promoter(store, deliverer, max_idle=0.2, lease=2).start()
    try:
        wait_for(lambda: store.stats().dead == 1, timeout=15, what="the failing message dead-lettered")
    finally:
        promoter.stop()
    assert deliverer.delivered == {"a": 1, "attach": 2, "b": 1}
    info = store.get("attach")
    assert info is not None and "report-\\udcff.pdf" in (info.error or ""), info.error
    assert promoter.counters.errors == 0 and promoter.counters.promoted == 2


class SlowFirstPublish:
    """A broker that blocks its publishers for a while (a RabbitMQ memory alarm): the first delivery takes
    longer than the lease; every delivery is noted."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.delivered: list[str] = []
        self._lock = threading.Lock()

    def deliver(self, message: ClaimedMessage) -> None:
        with self._lock:
            first = not self.delivered
            self.delivered.append(message.id)
        if first:
            time.sleep(self.seconds)


def test_a_publish_slower_than_the_lease_keeps_it_and_runs_once(redis_server, namespace):
    store = DelayStore(redis_server.client(), namespace=namespace, max_attempts=2)
    deliverer = SlowFirstPublish(seconds=3.5)
    ids = park_now(store, 5)
    promoters = [Promoter(store, deliverer, max_idle=0.1, lease=1.0).start()]
    try:
        time.sleep(0.3)  # the first promoter holds the batch, stuck in its first publish
        promoters.append(Promoter(store, deliverer, max_idle=0.1, lease=1.0).start())
        wait_for(lambda: store.stats().parked + store.stats().inflight == 0, timeout=20, what="all delivered")
    finally:
        for promoter in promoters:
            promoter.stop()
    assert Counter(deliverer.delivered) == Counter(ids), "each once: the stuck holder renewed its lease"
    stats = store.stats()
    assert stats.dead == 0 and stats.counters.get("retried", 0) == 0


def test_a_promoter_warns_of_a_redis_that_may_evict_parked_messages(namespace, ready_key, caplog):
    with EmbeddedRedis(["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        store = DelayStore(server.client(), namespace=namespace)
        for policy, warned in (("allkeys-lru", True), ("noeviction", False)):
            server.client().config_set("maxmemory-policy", policy)
            caplog.clear()
            promoter = Promoter(store, direct(ready_key), max_idle=0.2).start()
            # A stop asked for before its first cycle would end it before it looked (a busy machine does that).
            wait_for(lambda promoter=promoter: promoter.counters.cycles > 0, timeout=10, what="a first cycle")
            promoter.stop()
            said = f"Redis 127.0.0.1:{server.port} may evict keys (maxmemory-policy allkeys-lru)" in caplog.text
            assert said is warned and (warned or "may evict" not in caplog.text)


class HangsOnFirst:
    """A publish that hangs (no timeout, a broker that stopped answering) until released; every delivery noted."""

    def __init__(self) -> None:
        self.delivered: list[str] = []
        self.hanging = threading.Event()
        self.release = threading.Event()

    def deliver(self, message: ClaimedMessage) -> None:
        if not self.hanging.is_set():
            self.hanging.set()
            self.release.wait(30)
        self.delivered.append(message.id)


def test_a_hung_delivery_gives_back_the_rest_of_its_batch(redis_server, namespace):
    store = DelayStore(redis_server.client(), namespace=namespace)
    deliverer = HangsOnFirst()
    ids = park_now(store, 10)
    stuck = Promoter(store, deliverer, batch=10, max_idle=0.1, lease=1.0).start()
    assert deliverer.hanging.wait(10)
    other = Promoter(store, deliverer, batch=10, max_idle=0.1, lease=1.0).start()
    try:
        wait_for(lambda: len(deliverer.delivered) == 9, timeout=10, what="the rest delivered by the other promoter")
        # Delivered, then acknowledged: the hung one stays leased to its promoter.
        wait_for(lambda: store.stats().inflight == 1, timeout=10, what="the other promoter's acks")
        deliverer.release.set()
        wait_for(lambda: store.stats().inflight == 0, timeout=10, what="the hung one acknowledged")
        time.sleep(1.5)  # past a lease: nothing delivered twice
    finally:
        deliverer.release.set()
        for promoter in (stuck, other):
            promoter.stop()
    assert Counter(deliverer.delivered) == Counter(ids)
    assert store.stats().dead == 0 and store.stats().parked == 0


def test_a_publish_slower_than_the_lease_keeps_it_while_redis_is_full(namespace):
    # Over maxmemory Redis refuses a script's first write that may grow memory: a renewal refused there let the
    # other promoter deliver the message again, and again, until it was dead-lettered.
    with EmbeddedRedis(["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]) as server:
        store = DelayStore(server.client(), namespace=namespace, max_attempts=3)
        ids = park_now(store, 1)
        with pytest.raises(StoreFull):
            for n in range(100_000):
                store.park(f"filler-{n}", envelope(b"f" * 1000), delay=3600)
        deliverer = SlowFirstPublish(seconds=3.5)
        promoters = [Promoter(store, deliverer, batch=1, max_idle=0.1, lease=1.0).start() for _ in range(2)]
        try:
            wait_for(lambda: deliverer.delivered and store.stats().inflight == 0, timeout=20, what="delivered")
            time.sleep(1.5)  # a lease's worth more: a second delivery would show
        finally:
            for promoter in promoters:
                promoter.stop()
        assert deliverer.delivered == ids, "once: its holder renewed the lease although Redis is full"
        assert store.stats().dead == 0


def test_a_retry_comes_after_its_backoff_not_after_the_promoters_sleep(redis_server, namespace):
    store = DelayStore(redis_server.client(), namespace=namespace, retry_backoff=(0.5, 60))
    deliverer = FailsOnce()
    promoter = Promoter(store, deliverer, max_idle=20).start()
    try:
        time.sleep(0.3)
        store.park("job", envelope(), delay=0)
        wait_for(lambda: len(deliverer.attempts) == 2, timeout=15, what="the retry")
    finally:
        promoter.stop()
    gap = deliverer.attempts[1] - deliverer.attempts[0]
    print(f"retry after {gap:.2f} s (backoff 0.5 s, max_idle 20 s)")
    assert gap < 5, "woken for the retry, not after max_idle"


def test_sharded_store_on_one_server_promotes_every_shard_and_wakes_per_shard(redis_server, namespace, ready_key):
    client = redis_server.client()
    store = DelayStore(client, namespace=namespace, shards=5)
    promoter = Promoter(store, direct(ready_key), max_idle=20).start()
    try:
        time.sleep(0.5)  # asleep, nothing parked
        ids = [f"s-{n}" for n in range(50)]
        assert len({store.shard_for(id) for id in ids}) == 5
        store.park_many([ParkRequest(id, envelope(id.encode()), delay=0.3) for id in ids])
        wait_for(lambda: client.llen(ready_key) == 50, timeout=5, what="every shard promoted, well before max_idle")
        assert sorted(item.decode() for item in client.lrange(ready_key, 0, -1)) == sorted(ids)
    finally:
        promoter.stop()
        client.delete(ready_key, *(key for space in store.shards for key in space.all()))


def test_a_shard_that_fails_holds_up_only_its_own_messages(redis_server, namespace, ready_key, caplog):
    """One master of a Cluster down or short of replicas, or one shard's keys refused: the other shards go on
    being promoted, and the failed one is promoted once it serves again."""
    client = redis_server.client()
    store = DelayStore(client, namespace=namespace, shards=4)
    ids = [f"iso-{n}" for n in range(40)]
    store.park_many([ParkRequest(id, envelope(id.encode()), delay=0) for id in ids])
    broken = store.shards[1]
    client.set(broken.errors, "not a hash")  # the shard's promotion is refused, naming that key
    promoter = Promoter(store, direct(ready_key), max_idle=1)
    try:
        healthy = sorted(id for id in ids if store.shard_for(id) != 1)
        for _ in range(3):
            promoter.step()
        assert sorted(item.decode() for item in client.lrange(ready_key, 0, -1)) == healthy
        assert "shard 1 unavailable" in caplog.text
        client.delete(broken.errors)
        wait_for(lambda: (promoter.step(), client.llen(ready_key))[1] == len(ids), timeout=15, what="shard 1 too")
    finally:
        client.delete(ready_key, *(key for space in store.shards for key in space.all()))


def test_a_far_future_park_wakes_nobody(store, client):
    store.park("soon", envelope(), delay=60)
    client.delete(store.keys.wake)
    store.park("later", envelope(), delay=3600)
    assert client.llen(store.keys.wake) == 0
    store.park("sooner", envelope(), delay=1)
    assert client.llen(store.keys.wake) == 1


def test_idle_promoter_makes_at_most_about_one_call_per_second(redis_server, namespace, ready_key):
    client = redis_server.client()
    store = DelayStore(client, namespace=namespace)
    store.park("far", envelope(), delay=3600)
    promoter = Promoter(store, direct(ready_key), max_idle=5).start()
    try:
        time.sleep(0.5)
        before = client_calls(client)
        time.sleep(6)
        after = client_calls(client)
    finally:
        promoter.stop()
    calls_per_second = (after - before) / 6
    print(f"idle promoter: {calls_per_second:.2f} Redis calls/s")
    assert calls_per_second <= 1.0


def client_calls(client: redis.Redis) -> int:
    """Round trips clients made (scripts count once; commands inside a script are not round trips)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval", "blpop"))


class RedisRestartsDuringFirstDelivery:
    """Every delivery is noted; the first one takes redis-server down, to be back half a second later (a
    failover, a slot in migration): the claim's ack meets Redis away."""

    def __init__(self, server: EmbeddedRedis) -> None:
        self.server = server
        self.delivered: list[str] = []
        self.restarted = threading.Event()

    def deliver(self, message: ClaimedMessage) -> None:
        self.delivered.append(message.id)
        if len(self.delivered) == 1:
            self.server.stop(kill=True)
            threading.Timer(0.5, lambda: (self.server.start(), self.restarted.set())).start()


def test_an_ack_that_meets_redis_away_is_made_when_it_is_back_within_the_lease(namespace):
    with EmbeddedRedis(["--appendonly", "yes", "--appendfsync", "always"]) as server:
        # No retries of redis-py's own, which would hide a short outage from the promoter.
        client = server.client(socket_timeout=2, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        store = DelayStore(client, namespace=namespace)
        deliverer = RedisRestartsDuringFirstDelivery(server)
        ids = park_now(store, 5)
        promoter = Promoter(store, deliverer, max_idle=0.2, lease=4.0).start()
        try:
            assert deliverer.restarted.wait(10)
            wait_for(lambda: store.stats().parked + store.stats().inflight == 0, timeout=10, what="acked")
            time.sleep(5)  # past the lease: an unacknowledged claim would be taken and delivered again
        finally:
            promoter.stop()
        assert Counter(deliverer.delivered) == Counter(ids), "each once"
        assert store.stats().dead == 0


def test_stop_does_not_wait_out_the_lease_while_redis_is_away(namespace):
    # The ack is tried again while the lease holds, but a stop asked for meanwhile ends that after one more try.
    with EmbeddedRedis() as server:
        client = server.client(socket_timeout=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        store = DelayStore(client, namespace=namespace)
        park_now(store, 3)
        gone = threading.Event()

        class KillsRedis:
            def deliver(self, message: ClaimedMessage) -> None:
                if not gone.is_set():
                    server.stop(kill=True)
                    gone.set()

        promoter = Promoter(store, KillsRedis(), max_idle=0.2, lease=30).start()
        assert gone.wait(10)
        time.sleep(0.5)  # the ack failing, tried again
        started = time.monotonic()
        promoter.stop(timeout=5)
        assert not promoter.running and time.monotonic() - started < 5


def test_a_promoter_started_while_redis_is_away_waits_for_it(namespace, ready_key):
    server = EmbeddedRedis()  # not started yet: the promoter starts first, as a worker may on a reboot
    try:
        store = DelayStore(server.client(socket_timeout=2, socket_connect_timeout=0.5), namespace=namespace)
        promoter = Promoter(store, direct(ready_key), max_idle=0.2).start()
        wait_for(lambda: promoter.counters.errors >= 1, timeout=10, what="an outage backed off from")
        server.start()
        store.park("after", envelope(b"after"), delay=0.2)
        wait_for(lambda: server.client().llen(ready_key) == 1, timeout=20, what="promoted once Redis is up")
        assert promoter.running
        promoter.stop()
    finally:
        server.close()


def test_promoter_rides_out_a_redis_outage(namespace, ready_key):
    with EmbeddedRedis(["--appendonly", "yes", "--appendfsync", "always"]) as server:
        store = DelayStore(server.client(socket_timeout=5, socket_connect_timeout=1), namespace=namespace)
        promoter = Promoter(store, direct(ready_key), max_idle=0.5).start()
        try:
            park_now(store, 10, "before")
            wait_for(lambda: server.client().llen(ready_key) == 10, timeout=10)
            store.park("parked-before-outage", envelope(b"kept"), delay=3)
            server.stop()
            with pytest.raises(StoreUnavailable):
                store.park("during", envelope(), delay=0)
            wait_for(lambda: promoter.counters.errors >= 1, timeout=20)
            server.start()
            store.park("after", envelope(b"after"), delay=0.2)
            wait_for(lambda: server.client().llen(ready_key) == 12, timeout=30)
            assert promoter.running
        finally:
            promoter.stop()
        assert sorted(server.client().lrange(ready_key, -2, -1)) == [b"after", b"kept"]


def _spawn(url: str, namespace: str, target: str, *extra: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.promoter_process", url, namespace, target, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _stop(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)  # its stacks, on stderr
            time.sleep(1)
            process.kill()
            raise


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])
def test_two_promoter_processes_deliver_ten_thousand_messages_exactly_once(
    redis_server, store, client, ready_key, mode
):
    ids = park_now(store, 10_000)
    extra = ["--lease-mode"] if mode == "at-least-once" else []
    processes = [_spawn(redis_server.url, store.keys.namespace, ready_key, *extra) for _ in range(2)]
    try:
        wait_for(lambda: client.llen(ready_key) >= 10_000, timeout=120)
        time.sleep(0.5)
    finally:
        _stop(processes)
    delivered = drain(client, ready_key)
    print(f"{mode}: delivered {len(delivered)}, duplicates {sum(delivered.values()) - len(delivered)}")
    assert set(delivered) == set(ids)
    assert max(delivered.values()) == 1
    stats = store.stats()
    assert (stats.parked, stats.inflight, stats.dead) == (0, 0, 0)


def test_promoter_killed_mid_batch_its_claim_is_delivered_by_another_after_the_lease(
    redis_server, store, client, ready_key
):
    ids = park_now(store, 40)
    victim = _spawn(
        redis_server.url, store.keys.namespace, ready_key, "--lease-mode", "--deliver-sleep", "0.1", "--lease", "2"
    )
    wait_for(lambda: client.llen(ready_key) >= 5, timeout=20)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    stranded = store.stats().inflight
    assert stranded > 0, "the killed promoter held claimed messages"
    survivor = _spawn(redis_server.url, store.keys.namespace, ready_key, "--lease-mode", "--lease", "2")
    try:
        wait_for(lambda: set(drain(client, ready_key)) == set(ids), timeout=30)
    finally:
        _stop([survivor])
    delivered = drain(client, ready_key)
    duplicates = sum(delivered.values()) - len(delivered)
    print(f"kill -9 mid-batch: {stranded} stranded, all {len(ids)} delivered, {duplicates} duplicates")
    # Deliveries are acknowledged per batch: at most the batch in hand is delivered again, never more.
    assert duplicates <= 100 and max(delivered.values()) <= 2
    stats = store.stats()
    assert (stats.parked, stats.inflight, stats.dead) == (0, 0, 0)


def test_list_deliverer_refuses_unknown_routes(store, client, ready_key):
    deliverer = ListDeliverer(client, {"ready": ListTarget(ready_key)})
    store.park("x", envelope(route="elsewhere"), delay=0)
    claim = store.claim(10, lease=30, promoter_id="p")
    with pytest.raises(DeliveryRefused, match="unknown route"):
        deliverer.deliver(claim.messages[0])
