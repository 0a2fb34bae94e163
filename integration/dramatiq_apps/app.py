"""A Dramatiq app with DelayMiddleware on the broker named by environment variables.

Run by the integration tests as ``python -m dramatiq integration.dramatiq_apps.app:broker`` and imported by
them as a producer (:func:`build`). Actors record what they run with RPUSH to a list the test owns, so the
test can tell how often and when each message ran.

Environment:
  DB_BROKER         redis | rabbitmq | sqs
  DB_REDIS_URL      the test's redis-server: the records, the delay store (and the RedisBroker itself)
  DB_RABBIT_URL     amqp URL (rabbitmq)           DB_SQS_ENDPOINT  moto endpoint (sqs)
  DB_BROKER_NS      RedisBroker / SQSBroker namespace
  DB_STORE_NS       delay store namespace           DB_THRESHOLD     seconds
  DB_QUEUES         comma-separated queue names; each gets its own actors
  DB_RECORD_KEY     list the actors and the probe RPUSH their events to
  DB_SCHEDULE       optional cron expression: the first queue's record actor runs on it (token "cron")
  DB_STORE_URL      optional: the delay store's URL when it is not DB_REDIS_URL (redis+cluster://, ...)
  DB_STORE_SHARDS   optional: shards of the delay store namespace
  DB_STORE_REPLICAS optional: durable writes (replicas to confirm each write)
  DB_PACK_AFTER     optional: seconds, the store's pack_after ('none': packs nothing)
  DB_FAR_URL        optional: PostgreSQL URL of a far tier (with DB_FAR_HORIZON seconds, DB_FAR_SWEEP seconds)
  DB_SLOW_IMPORT    optional: seconds each batch ``delay-broker import`` parks waits before leaving the broker
  DB_SENTINEL_URL   redis+sentinel:// URL of the RedisBroker's Redis (DB_BROKER=redis-sentinel); the store
                    lives in that master too
  DB_ONCE           optional: set, the broker gets an OnceMiddleware (effectively-once execution)
  DB_PROMOTE        optional: "0", the workers run no promoter thread (the test promotes)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import redis
from dramatiq.errors import Retry
from dramatiq.middleware import CurrentMessage

from delay_broker.dramatiq import DelayMiddleware, OnceMiddleware
from delay_broker.far import FarTier

LONG_RETRY_MS = 20 * 60 * 1000
"""Longer than SQS's 15-minute limit: dramatiq-sqs alone loses such a retry."""


class Recorder:
    """RPUSHes JSON events to the test's list (one client per process; redis-py reconnects after a fork)."""

    def __init__(self, url: str, key: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = key

    def __call__(self, event: str, **fields: Any) -> None:
        fields.update(event=event, t=int(time.time() * 1000), pid=os.getpid())
        self.client.rpush(self.key, json.dumps(fields))


class Probe(dramatiq.Middleware):
    """Records worker boots, and every message a worker holds in memory for its eta (the native delay)."""

    def __init__(self, record: Recorder) -> None:
        self.record = record

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.record("boot")

    def before_delay_message(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        self.record("held", id=message.message_id)


@dataclass
class App:
    broker: dramatiq.Broker
    middleware: DelayMiddleware
    actors: dict[str, dict[str, dramatiq.Actor[Any, Any]]] = field(default_factory=dict)


def make_broker(env: Mapping[str, str]) -> dramatiq.Broker:
    kind = env["DB_BROKER"]
    if kind == "redis":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=env["DB_REDIS_URL"], namespace=env["DB_BROKER_NS"])  # type: ignore[no-untyped-call]
    if kind == "redis-sentinel":
        from dramatiq.brokers.redis import RedisBroker

        from delay_broker.connect import client_from_url

        client = client_from_url(env["DB_SENTINEL_URL"])
        return RedisBroker(client=client, namespace=env["DB_BROKER_NS"])  # type: ignore[no-untyped-call]
    if kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        # Publisher confirms: a promoted message is acknowledged in the store only once RabbitMQ has it.
        return RabbitmqBroker(url=env["DB_RABBIT_URL"], confirm_delivery=True)
    if kind == "sqs":
        from dramatiq_sqs import SQSBroker

        sqs: dramatiq.Broker = SQSBroker(
            namespace=env["DB_BROKER_NS"], endpoint_url=env["DB_SQS_ENDPOINT"], region_name="us-east-1"
        )
        return sqs
    raise ValueError(f"unknown DB_BROKER {kind!r}")


def build(env: Mapping[str, str]) -> App:
    broker = make_broker(env)
    record = Recorder(env["DB_REDIS_URL"], env["DB_RECORD_KEY"])
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(Probe(record))
    # RedisBroker: no redis_url, so the store lives in the broker's Redis and promotion is exactly-once.
    redis_url = None if env["DB_BROKER"].startswith("redis") else env.get("DB_STORE_URL", env["DB_REDIS_URL"])
    store_options: dict[str, Any] = {}
    if env.get("DB_STORE_SHARDS"):
        store_options["shards"] = int(env["DB_STORE_SHARDS"])
    if env.get("DB_STORE_REPLICAS"):
        store_options["replicas"] = int(env["DB_STORE_REPLICAS"])
    if env.get("DB_PACK_AFTER"):
        store_options["pack_after"] = None if env["DB_PACK_AFTER"] == "none" else float(env["DB_PACK_AFTER"])
    if env.get("DB_FAR_URL"):
        horizon, sweep = float(env["DB_FAR_HORIZON"]), float(env.get("DB_FAR_SWEEP", "0.2"))
        store_options["far_tier"] = FarTier(env["DB_FAR_URL"], horizon=horizon, sweep_interval=sweep)
    middleware = DelayMiddleware(
        redis_url=redis_url,
        namespace=env["DB_STORE_NS"],
        threshold=float(env["DB_THRESHOLD"]),
        max_idle=1.0,
        lease=20.0,
        store_options=store_options,
        promote_in_workers=env.get("DB_PROMOTE") != "0",
    )
    broker.add_middleware(middleware)
    if env.get("DB_ONCE"):
        broker.add_middleware(OnceMiddleware())
    app = App(broker, middleware)
    for queue in env["DB_QUEUES"].split(","):
        app.actors[queue] = declare_actors(broker, queue, record)
    if env.get("DB_SCHEDULE"):
        first = app.actors[env["DB_QUEUES"].split(",")[0]]["record"]
        middleware.schedule(first, env["DB_SCHEDULE"], args=("cron",), name="tick")
    return app


def declare_actors(broker: dramatiq.Broker, queue: str, record: Recorder) -> dict[str, dramatiq.Actor[Any, Any]]:
    def current() -> dramatiq.Message[Any]:
        message = CurrentMessage.get_current_message()
        assert message is not None
        return message

    def run(token: str) -> int:
        message = current()
        retries = int(message.options.get("retries", 0))
        promotion = message.options.get("delay_broker_promotion")  # set by promoters when the broker has OnceMiddleware
        record("run", token=token, id=message.message_id, retries=retries, promotion=promotion)
        return retries

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"record_{queue}")
    def record_run(token: str) -> None:
        run(token)

    # Retries: the backoff after the first failure is 1.25-2.5 s, above a 1 s threshold.
    @dramatiq.actor(
        broker=broker, queue_name=queue, actor_name=f"flaky_{queue}", max_retries=1, min_backoff=2000, max_backoff=2500
    )
    def flaky(token: str) -> None:
        if run(token) == 0:
            raise RuntimeError("first attempt fails on purpose")

    # The same with a backoff below a 1 s threshold: the retry goes straight to the broker, not parked again.
    @dramatiq.actor(
        broker=broker,
        queue_name=queue,
        actor_name=f"flaky_short_{queue}",
        max_retries=1,
        min_backoff=50,
        max_backoff=100,
    )
    def flaky_short(token: str) -> None:
        if run(token) == 0:
            raise RuntimeError("first attempt fails on purpose")

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"retry_long_{queue}", max_retries=1)
    def retry_long(token: str) -> None:
        if run(token) == 0:
            raise Retry("try again in 20 minutes", delay=LONG_RETRY_MS)

    return {"record": record_run, "flaky": flaky, "flaky_short": flaky_short, "retry_long": retry_long}


if os.environ.get("DB_SLOW_IMPORT"):
    from integration.slow_import import install

    install(float(os.environ["DB_SLOW_IMPORT"]))

if os.environ.get("DB_BROKER"):
    app = build(os.environ)
    broker = app.broker
    dramatiq.set_broker(broker)
