"""The Dramatiq side of the chaos run: ``dramatiq integration.chaos.dramatiq_app`` with the lane in the environment.

One actor, ``chaos_run(id, due_ms)``, records its execution. The broker is the lane's (``CHAOS_BROKER``: redis,
rabbitmq or sqs); ``DelayMiddleware`` parks every delayed send and promotes from a thread of each worker, and
on the at-least-once lanes ``OnceMiddleware`` drops a second delivery of a promotion (unless the run is made
``--without-once``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import dramatiq

from delay_broker.dramatiq import DelayMiddleware, OnceMiddleware

from .common import (
    ENV_BATCH,
    ENV_BROKER,
    ENV_BROKER_URL,
    ENV_LANE,
    ENV_LEASE,
    ENV_ONCE,
    ENV_STORE_URL,
    THRESHOLD_S,
    Recorder,
    namespace,
)

HEARTBEAT_TIMEOUT_MS = 10_000
"""RedisBroker: a SIGKILLed worker's unacknowledged messages go back to the queue after this (default 60 s)..."""

MAINTENANCE_CHANCE = 100_000
"""... at the next maintenance, which runs on 1,000 commands in a million by default: an idle queue could wait
for it for the rest of the run. 10 % here."""

SQS_VISIBILITY_S = 30
"""dramatiq-sqs defaults to 12 h: a killed worker's messages would stay invisible for the rest of the run."""


def make_broker(env: Mapping[str, str]) -> dramatiq.Broker:
    kind, url, space = env[ENV_BROKER], env[ENV_BROKER_URL], namespace(env)
    if kind == "redis":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(  # type: ignore[no-untyped-call]
            url=url, namespace=space, heartbeat_timeout=HEARTBEAT_TIMEOUT_MS, maintenance_chance=MAINTENANCE_CHANCE
        )
    if kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url, confirm_delivery=True)
    if kind == "sqs":
        from dramatiq_sqs import SQSBroker

        sqs: dramatiq.Broker = SQSBroker(
            namespace=space, endpoint_url=url, region_name="us-east-1", visibility_timeout=SQS_VISIBILITY_S
        )
        return sqs
    raise ValueError(f"unknown {ENV_BROKER} {kind!r}")


def build(env: Mapping[str, str]) -> tuple[dramatiq.Broker, dramatiq.Actor[Any, Any]]:
    broker = make_broker(env)
    store_url = env.get(ENV_STORE_URL) or None  # none: the store lives in the RedisBroker's Redis
    broker.add_middleware(
        DelayMiddleware(
            redis_url=store_url,
            namespace=namespace(env),
            threshold=THRESHOLD_S,
            batch=int(env[ENV_BATCH]),
            lease=float(env[ENV_LEASE]),
            max_idle=1.0,
            # A park acknowledged only once the replica has it: a failover loses no acknowledged park.
            store_options={"replicas": 1, "replica_timeout": 0.5} if store_url else {},
        )
    )
    if env.get(ENV_ONCE):
        # Effectively once: the promoters mark what they promote, the workers drop a second delivery of it.
        broker.add_middleware(OnceMiddleware())
    record = Recorder(env)

    @dramatiq.actor(broker=broker, queue_name=namespace(env), actor_name="chaos_run", max_retries=20)
    def chaos_run(id: str, due_ms: int) -> None:
        record(id, due_ms)

    return broker, chaos_run


if os.environ.get(ENV_LANE):
    broker, chaos_run = build(os.environ)
    dramatiq.set_broker(broker)
