"""Reliable fetch on our Celery Redis transport: a worker killed just after taking a task loses nothing.

kombu's own fetch pops the task (BRPOP) and records it as unacknowledged only after parsing the reply. The
consumer below is killed exactly there, at the moment kombu hands the parsed task to its consumer, which is
where a SIGKILL lands in practice on a busy worker (the chaos run lost a task in about one kill in three).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from delay_broker.embedded import EmbeddedRedis

from .celery_apps.brokers import env_for
from .celery_apps.harness import wait_for

ROOT = Path(__file__).resolve().parents[1]
TRANSPORT = "delay_broker.celery.transport:RedisTransport"

DIE_ON_DELIVERY = textwrap.dedent(
    """
    import os, sys, json
    from kombu import Connection, Exchange, Queue
    from kombu.transport.virtual.base import Transport

    url, transport, options, queue_name = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]

    def killed(*args, **kwargs):  # the task is parsed and about to reach its consumer: SIGKILL here
        os._exit(9)

    Transport._deliver = killed
    with Connection(url, transport=transport or None, transport_options=options) as connection:
        queue = Queue(queue_name, Exchange(queue_name), queue_name)
        with connection.Consumer(queue, callbacks=[lambda body, message: None]):
            connection.drain_events(timeout=30)
    """
)


def transport_options(unique: str, **delay_broker: Any) -> dict[str, Any]:
    return {
        "global_keyprefix": f"fetch-{unique}:",
        "visibility_timeout": 1,
        "delay_broker": {"namespace": f"fetch-{unique}", "threshold": 0.5, **delay_broker},
    }


def publish(server: EmbeddedRedis, options: dict[str, Any], queue_name: str, body: str) -> None:
    with Connection(server.url, transport=TRANSPORT, transport_options=options) as connection:
        queue = Queue(queue_name, Exchange(queue_name), queue_name)
        connection.Producer().publish(body, exchange=queue.exchange, routing_key=queue_name, declare=[queue])


def kill_at_delivery(server: EmbeddedRedis, transport: str, options: dict[str, Any], queue_name: str) -> None:
    process = subprocess.run(
        [sys.executable, "-c", DIE_ON_DELIVERY, server.url, transport, json.dumps(options), queue_name],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert process.returncode == 9, process.stderr.decode()[-2000:]


def receive_all(
    server: EmbeddedRedis, options: dict[str, Any], queue_name: str, expected: int, seconds: float
) -> list[str]:
    """What a healthy consumer receives (and acknowledges) once it has ``expected`` messages, restores included."""
    received: list[str] = []

    def on_message(body: Any, message: Any) -> None:
        received.append(body)
        message.ack()

    with Connection(server.url, transport=TRANSPORT, transport_options=options) as connection:
        queue = Queue(queue_name, Exchange(queue_name), queue_name)
        with connection.Consumer(queue, callbacks=[on_message]):
            channel = connection.default_channel
            wait_for(
                lambda: _drain_and_restore(connection, channel) or len(received) >= expected, seconds, what="restored"
            )
            _drain_and_restore(connection, channel)
    return received


def _drain_and_restore(connection: Connection, channel: Any) -> None:
    channel.qos.restore_visible(interval=1)  # what a worker's timer runs every unacked_restore_interval
    with contextlib.suppress(TimeoutError):
        connection.drain_events(timeout=0.3)


def unacked(server: EmbeddedRedis, options: dict[str, Any]) -> dict[bytes, bytes]:
    return redis.Redis.from_url(server.url).hgetall(options["global_keyprefix"] + "unacked")


def test_a_worker_killed_after_the_fetch_loses_nothing(redis_server: EmbeddedRedis) -> None:
    unique = uuid.uuid4().hex[:10]
    options, queue_name = transport_options(unique), f"q-{unique}"
    bodies = [f"survives-{n}" for n in range(3)]
    for body in bodies:
        publish(redis_server, options, queue_name, body)

    kill_at_delivery(redis_server, TRANSPORT, options, queue_name)

    # One fetch took all three (the consumer had room for them) and recorded each before they left their list.
    records = [json.loads(record) for record in unacked(redis_server, options).values()]
    assert sorted(_body(message) for message, _, _ in records) == bodies
    assert {(exchange, routing_key) for _, exchange, routing_key in records} == {(queue_name, queue_name)}
    # After visibility_timeout (1 s) the restore gives them to a healthy consumer, once each.
    assert sorted(receive_all(redis_server, options, queue_name, len(bodies), 20)) == bodies
    assert unacked(redis_server, options) == {}


def test_a_backlog_on_a_list_not_waited_on_drains_without_waiting_per_batch(redis_server: EmbeddedRedis) -> None:
    """The fetch waits on one list (priority 0 of the first queue). Tasks sent with a priority sit on another: once
    a fetch comes back full, the next must not wait brpop_timeout again, or a backlog drains 4 tasks per wait."""
    unique = uuid.uuid4().hex[:10]
    options, queue_name = {**transport_options(unique), "brpop_timeout": 3}, f"q-{unique}"
    bodies = [f"urgent-{n}" for n in range(100)]
    with Connection(redis_server.url, transport=TRANSPORT, transport_options=options) as connection:
        queue = Queue(queue_name, Exchange(queue_name), queue_name)
        producer = connection.Producer()
        for body in bodies:
            producer.publish(body, exchange=queue.exchange, routing_key=queue_name, declare=[queue], priority=9)
    # One wait of brpop_timeout (3 s; 1 s where kombu has no such option) at most, then batch after batch: at
    # one batch of 4 per wait the 100 would take 25 waits.
    assert sorted(receive_all(redis_server, options, queue_name, len(bodies), 15)) == sorted(bodies)


def test_kombus_own_fetch_loses_the_task_there(redis_server: EmbeddedRedis) -> None:
    """The same kill on kombu's own fetch (``reliable_fetch`` off): the task is gone from Redis."""
    unique = uuid.uuid4().hex[:10]
    options, queue_name = transport_options(unique, reliable_fetch=False), f"q-{unique}"
    publish(redis_server, options, queue_name, "lost")

    kill_at_delivery(redis_server, TRANSPORT, options, queue_name)

    client = redis.Redis.from_url(redis_server.url)
    assert unacked(redis_server, options) == {}
    assert client.llen(options["global_keyprefix"] + queue_name) == 0


def _body(message: dict[str, Any]) -> str:
    import base64

    raw = message["body"]
    encoding = message["properties"].get("body_encoding")
    return base64.b64decode(raw).decode() if encoding == "base64" else raw


@pytest.mark.timeout(120)
def test_celery_workers_with_reliable_fetch(request: pytest.FixtureRequest) -> None:
    """A real worker: plain tasks, a priority task (another list than the first) and a parked one each run once,
    and a control reply (a no_ack consumer) leaves no unacked record behind."""
    unique = uuid.uuid4().hex[:10]
    env = env_for("redis", request, unique, transport_options={"queue_order_strategy": "priority"})
    client = redis.Redis.from_url(env.env["DBT_BROKER_URL"])
    waits_before = _calls(client, "blmove")
    try:
        env.start_worker("w1")
        record = env.task("record")
        results = [record.apply_async((f"plain-{n}",)) for n in range(20)]
        results.append(record.apply_async(("priority",), priority=9))
        results.append(record.apply_async(("parked",), countdown=3))
        wait_for(lambda: len(env.records()) >= len(results), 60, what="every task ran")
        assert sorted(env.run_counts().values()) == [1] * len(results)
        assert env.app.control.ping(timeout=5), "the worker answered the ping"
        assert _calls(client, "blmove") > waits_before, "the worker waits with BLMOVE (reliable fetch), not BRPOP"
        prefix = json.loads(env.env["DBT_OPTIONS"])["global_keyprefix"]
        wait_for(lambda: client.hlen(prefix + "unacked") == 0, 10, what="no unacked record left")
    finally:
        env.close()


def _calls(client: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _kombu_message(tag: str | None, exchange: str, routing_key: str, **properties: Any) -> str:
    """A message as kombu's virtual channel stores it (properties last, delivery_tag last in them)."""
    props: dict[str, Any] = {"correlation_id": "c", "reply_to": "r", "delivery_mode": 2}
    props["delivery_info"] = {"exchange": exchange, "routing_key": routing_key}
    props.update(priority=0, body_encoding="base64", **properties)
    if tag is not None:
        props["delivery_tag"] = tag
    return json.dumps({"body": "Ym9keQ==", "content-encoding": "utf-8", "headers": {"id": "x"}, "properties": props})


@pytest.mark.parametrize(
    ("message", "record"),
    [
        pytest.param(_kombu_message("t-1", "", "q"), ("t-1", "", "q"), id="kombu's layout"),
        pytest.param(_kombu_message("t-2", 'ex"ch', "r\\k"), ("t-2", 'ex"ch', "r\\k"), id="escaped strings"),
        pytest.param(_kombu_message("t-3", "é", "q"), ("t-3", "é", "q"), id="non-ASCII"),
        pytest.param(_kombu_message("t-4", "e", "q", extra="after"), ("t-4", "e", "q"), id="tag not last"),
        pytest.param(
            json.dumps({"properties": {"delivery_tag": "t-5", "delivery_info": {"routing_key": "k", "exchange": "e"}}}),
            ("t-5", "e", "k"),
            id="another order",
        ),
        pytest.param(
            json.dumps(
                {
                    "headers": {"delivery_info": {"exchange": "no", "routing_key": "no"}, "delivery_tag": "no"},
                    "properties": {"delivery_info": {"exchange": "e", "routing_key": "k"}, "delivery_tag": "t-6"},
                }
            ),
            ("t-6", "e", "k"),
            id="look-alike keys in the headers",
        ),
        pytest.param(_kombu_message(None, "e", "q"), None, id="no tag: not recorded"),
        pytest.param("not json", None, id="not JSON: not recorded"),
    ],
)
def test_fetch_records_what_the_message_says(redis_server: EmbeddedRedis, message: str, record: Any) -> None:
    """fetch.lua reads the tag and routing of kombu's own layout without decoding the JSON, and decodes anything
    else: either way the unacked record is kombu's ``[message, exchange, routing_key]`` under the message's tag."""
    from delay_broker.celery.fetch import FETCH_SOURCE

    unique = uuid.uuid4().hex[:10]
    index, records, queue = f"fetch-{unique}:unacked_index", f"fetch-{unique}:unacked", f"fetch-{unique}:q"
    client = redis.Redis.from_url(redis_server.url)
    client.lpush(queue, message)
    try:
        taken = client.eval(FETCH_SOURCE, 3, index, records, queue, "1700000000.5", 4, "1")
        assert taken == [queue.encode(), message.encode(), 0 if record is None else 1]
        stored = client.hgetall(records)
        if record is None:
            assert stored == {} and client.zcard(index) == 0
            return
        tag, exchange, routing_key = record
        assert list(stored) == [tag.encode()]
        assert json.loads(stored[tag.encode()]) == [json.loads(message), exchange, routing_key]
        assert client.zscore(index, tag) == 1700000000.5
    finally:
        client.delete(index, records, queue)
