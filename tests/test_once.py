"""The records of effectively-once execution (delay_broker.once) against the session's real redis-server."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from delay_broker import ConfigurationError, DelayStore, Envelope, once
from delay_broker.embedded import EmbeddedRedis, free_port
from delay_broker.once import (
    DEFAULT_WINDOW,
    DROPPED_COUNTER,
    PROMOTION_MARK,
    Executions,
    Verdict,
    default_window,
    parse_token,
    promotion_token,
    window_too_short,
)


def dropped(store: DelayStore) -> int:
    return store.stats().counters.get(DROPPED_COUNTER, 0)


def test_a_second_delivery_of_one_execution_is_dropped_once_the_first_ran(store: DelayStore) -> None:
    executions = Executions(store, window=60)
    first = executions.begin("job-1", "1700000000000", 0)
    assert first.verdict is Verdict.RUN and first.runs
    executions.end(first, succeeded=True)
    second = executions.begin("job-1", "1700000000000", 0)
    assert second.verdict is Verdict.DUPLICATE and not second.runs
    assert executions.begin("job-1", "1700000000000", 0).verdict is Verdict.DUPLICATE
    assert dropped(store) == 2
    # The record lives on the message's shard, for the window.
    assert 59_000 < store.client.pttl(first.key) <= 60_000
    assert first.key == store.keys.key("once:1700000000000:0:job-1")


def test_a_delivery_that_began_and_never_ended_runs_again(store: DelayStore) -> None:
    """Its worker died mid-run (the broker redelivers that copy) or it is still running: dropping a copy then
    could lose the message, so it runs (at least once)."""
    executions = Executions(store)
    first = executions.begin("job", "17", 0)
    again = executions.begin("job", "17", 0)
    assert (first.verdict, again.verdict) == (Verdict.RUN, Verdict.RERUN)
    executions.end(again, succeeded=True)
    assert executions.begin("job", "17", 0).verdict is Verdict.DUPLICATE
    assert dropped(store) == 1


def test_a_failed_execution_leaves_no_record_and_retries_are_executions_of_their_own(store: DelayStore) -> None:
    executions = Executions(store)
    failed = executions.begin("job", "17", 0)
    executions.end(failed, succeeded=False)
    assert store.client.exists(failed.key) == 0
    assert executions.begin("job", "17", 0).verdict is Verdict.RUN  # a copy of a failed delivery runs
    retry = executions.begin("job", "17", 1)  # the framework's retry: same id and promotion, next retry count
    assert retry.verdict is Verdict.RUN
    executions.end(retry, succeeded=True)
    assert executions.begin("job", "17", 1).verdict is Verdict.DUPLICATE
    # Another park of the id (a new promotion token) is another execution.
    assert executions.begin("job", "18", 1).verdict is Verdict.RUN
    assert dropped(store) == 1


NOT_PROMOTED = [("job", None, 0), ("job", "", 0), ("job", "12a", 0), ("job", 17, 0), ("job", "1" * 17, 0)]
NOT_PROMOTED += [("", "17", 0), ("job", "17", -1), ("x" * 5000, "17", 0)]


@pytest.mark.parametrize(("id", "token", "attempt"), NOT_PROMOTED)
def test_what_is_not_a_promoted_delivery_is_not_checked(store: DelayStore, id: str, token: object, attempt: int):
    executions = Executions(store)
    for _ in range(2):
        execution = executions.begin(id, token, attempt)
        assert execution.verdict is Verdict.UNCHECKED and execution.runs
        executions.end(execution, succeeded=True)
    assert list(store.client.scan_iter(store.keys.key("once:*"))) == []


def test_a_store_that_cannot_be_reached_lets_messages_run_unchecked(caplog: pytest.LogCaptureFixture) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=RedisRetry(NoBackoff(), 0))
    down = DelayStore(client, shards=1)
    executions = Executions(down)
    caplog.set_level(logging.WARNING, "delay_broker.once")
    started = time.monotonic()
    verdicts = [executions.begin(f"job-{n}", "17", 0).verdict for n in range(50)]
    assert verdicts == [Verdict.UNCHECKED] * 50
    assert time.monotonic() - started < 2  # one failed call, then none for a second
    warnings = [r for r in caplog.records if "run unchecked (at least once)" in r.getMessage()]
    assert len(warnings) == 1 and "job-0" in warnings[0].getMessage()


def test_a_store_that_stops_answering_for_a_moment_is_waited_for_not_skipped() -> None:
    """A failover or a restart: the worker asks again for PATIENCE_S rather than run the message unchecked (a
    copy of an unchecked run is not dropped), and its record is made once the store is back."""
    with EmbeddedRedis() as server:
        client = server.client(socket_connect_timeout=0.5, retry=RedisRetry(NoBackoff(), 0))
        executions = Executions(DelayStore(client, shards=1), window=60)
        executions.end(executions.begin("before", "17", 0), succeeded=True)
        server.stop(kill=True)
        back = threading.Timer(1.0, server.start)
        back.start()
        try:
            started = time.monotonic()
            during = executions.begin("during", "17", 0)
            waited = time.monotonic() - started
        finally:
            back.join()
        assert during.verdict is Verdict.RUN and 0.8 < waited < once.PATIENCE_S
        executions.end(during, succeeded=True)
        assert executions.begin("during", "17", 0).verdict is Verdict.DUPLICATE
        client.close()


def test_a_store_down_for_longer_costs_one_wait_then_runs_unchecked_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(once, "PATIENCE_S", 0.5)
    caplog.set_level(logging.WARNING, "delay_broker.once")
    with EmbeddedRedis() as server:
        client = server.client(socket_connect_timeout=0.5, retry=RedisRetry(NoBackoff(), 0))
        executions = Executions(DelayStore(client, shards=1))
        executions.begin("known", "17", 0)  # the store answered: the layout is known
        server.stop(kill=True)
        started = time.monotonic()
        assert executions.begin("first", "17", 0).verdict is Verdict.UNCHECKED
        assert 0.4 < time.monotonic() - started < 2
        time.sleep(once.RETRY_AFTER_S)
        started = time.monotonic()
        assert executions.begin("later", "17", 0).verdict is Verdict.UNCHECKED
        assert time.monotonic() - started < 0.4, "asked once: patience ran out a moment ago"
        client.close()
    assert len([r for r in caplog.records if "run unchecked (at least once)" in r.getMessage()]) == 1


def test_with_replicas_a_finished_execution_is_recorded_on_the_replica_before_the_worker_goes_on() -> None:
    """replicas=1: the record that drops a second copy is confirmed by the replica, so a failover keeps it. A
    replica that lags is waited for (here: stopped for a second), not given up at its first timeout."""
    with EmbeddedRedis(["--repl-diskless-sync-delay", "0"]) as master, EmbeddedRedis() as replica:
        replica_client = replica.client()
        replica_client.replicaof("127.0.0.1", master.port)
        client = master.client()
        deadline = time.monotonic() + 10
        while client.wait(1, 100) < 1:
            assert time.monotonic() < deadline, "the replica did not sync"
        store = DelayStore(client, shards=1, replicas=1, replica_timeout=0.2)
        executions = Executions(store, window=60)
        first = executions.begin("job", "17", 0)
        executions.end(first, succeeded=True)
        assert replica_client.get(first.key) == b"d"
        second = executions.begin("job-2", "17", 0)
        assert replica.process is not None
        replica.process.send_signal(signal.SIGSTOP)
        resume = threading.Timer(1.0, replica.process.send_signal, [signal.SIGCONT])
        resume.start()
        try:
            started = time.monotonic()
            executions.end(second, succeeded=True)
            waited = time.monotonic() - started
        finally:
            resume.join()
        assert 0.8 < waited < once.PATIENCE_S and replica_client.get(second.key) == b"d"
        client.close()
        replica_client.close()


def test_a_drop_is_logged_once_per_id_and_counted_in_prometheus(
    store: DelayStore, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    executions = Executions(store, metrics=True, registry=registry)
    caplog.set_level(logging.INFO, "delay_broker.once")
    for id in ("a", "b"):
        executions.end(executions.begin(id, "17", 0), succeeded=True)
        for _ in range(3):
            assert executions.begin(id, "17", 0).verdict is Verdict.DUPLICATE
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Dropped a second delivery")]
    assert len(lines) == 2 and "message a " in lines[0] and "message b " in lines[1]
    labels = {"namespace": store.keys.namespace}
    assert registry.get_sample_value("delay_broker_duplicates_dropped_total", labels) == 6
    assert dropped(store) == 6


def test_records_of_a_sharded_store_sit_on_each_message_shard(client: redis.Redis, namespace: str) -> None:
    store = DelayStore(client, namespace=namespace, shards=4)
    executions = Executions(store)
    keys = {executions.begin(f"job-{n}", "17", 0).key for n in range(40)}
    tags = {key.split("{", 1)[1].split("}", 1)[0] for key in keys}
    assert len(tags) == 4 and tags == {space.tag for space in store.shards}
    for n in range(40):
        execution = executions.begin(f"job-{n}", "17", 0)
        executions.end(execution, succeeded=True)
    assert executions.begin("job-7", "17", 0).verdict is Verdict.DUPLICATE
    assert dropped(store) == 1  # counted in the shard's stats, summed by stats()


def test_the_promotion_token_is_the_parked_at_time_every_delivery_of_a_park_shares(store: DelayStore) -> None:
    store.park("m", Envelope(route="ready", payload=b"x"), delay=0)
    claimed = store.claim(10, 0.05, "p1").messages[0]
    time.sleep(0.1)  # the lease runs out: another promoter claims the same park and delivers it again
    again = store.claim(10, 30, "p2").messages[0]
    assert claimed.envelope is not None and again.envelope is not None
    token = promotion_token(claimed.envelope)
    assert token is not None and token == promotion_token(again.envelope) and parse_token(token) == token
    assert abs(int(token) - time.time() * 1000) < 10_000

    def parked_token(id: str) -> str | None:
        info = store.get(id)
        assert info is not None and info.envelope is not None
        return promotion_token(info.envelope)

    store.park("n", Envelope(route="ready", payload=b"x"), delay=60)
    first = parked_token("n")
    time.sleep(0.01)
    store.park("n", Envelope(route="ready", payload=b"x"), delay=60)  # parked again (a retry): another execution
    assert first is not None and parked_token("n") not in (None, first)
    assert promotion_token(Envelope(route="r", payload=b"")) is None  # no parked-at time: left unmarked
    assert PROMOTION_MARK == "delay_broker_promotion"


@pytest.mark.parametrize("window", [0, -1, float("inf"), float("nan"), True, "60"])
def test_a_bad_window_is_refused(store: DelayStore, window: object) -> None:
    with pytest.raises(ConfigurationError, match="window"):
        Executions(store, window=window)  # type: ignore[arg-type]
    assert DEFAULT_WINDOW == 3600


def test_the_default_window_covers_the_lease_and_the_brokers_redelivery() -> None:
    assert default_window(30) == DEFAULT_WINDOW  # RabbitMQ redelivers a dead worker's messages at once
    assert default_window(30, 1800) == DEFAULT_WINDOW  # kombu's SQS queues
    assert default_window(30, 43_200) == 43_290  # dramatiq-sqs's default visibility timeout, 12 hours
    assert window_too_short(3600, 30) is None and window_too_short(3600, 30, 1800) is None
    assert "lease of 30 s" in (window_too_short(20, 30) or "")
    assert "visibility timeout of 43200 s" in (window_too_short(3600, 30, 43_200) or "")


def test_celery_once_window_is_the_option_or_covers_the_transports_visibility_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from delay_broker.celery.config import once_window, parse_options

    on = parse_options({"once": True})
    assert once_window(on, "amqp", {}) == DEFAULT_WINDOW
    assert once_window(on, "redis", {}) == 3600 + 30 + 60  # kombu's Redis visibility_timeout: an hour
    assert once_window(on, "sqs", {"visibility_timeout": 7200}) == 7200 + 30 + 60
    caplog.set_level(logging.WARNING, "delay_broker.celery")
    assert once_window(parse_options({"once": True, "once_window": 600}), "sqs", {}) == 600
    assert "visibility timeout of 1800 s" in caplog.text
    with pytest.raises(ConfigurationError, match="once_window"):
        parse_options({"once_window": 0})
