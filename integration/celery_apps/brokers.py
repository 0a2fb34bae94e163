"""Broker settings of each transport for the integration tests (one namespace/queue/prefix per env)."""

from __future__ import annotations

from typing import Any

import pytest

from .harness import CeleryEnv


def env_for(kind: str, request: pytest.FixtureRequest, unique: str, **kwargs: Any) -> CeleryEnv:
    """A CeleryEnv on the session's private server for ``kind``; the delay store is the session redis."""
    redis_server = request.getfixturevalue("redis_server")
    transport_options: dict[str, Any] = dict(kwargs.pop("transport_options", {}) or {})
    if kind == "redis":
        # A key prefix of our own isolates kombu's global keys (unacked, bindings) from other tests.
        transport_options.setdefault("global_keyprefix", f"t{unique}:")
        return CeleryEnv.create(
            kind,
            broker_url=redis_server.url,
            record_url=redis_server.url,
            unique=unique,
            transport_options=transport_options,
            **kwargs,
        )
    if kind == "amqp":
        rabbitmq = request.getfixturevalue("rabbitmq")
        return CeleryEnv.create(
            kind,
            broker_url=rabbitmq.url,
            record_url=redis_server.url,
            unique=unique,
            store_url=redis_server.url,
            transport_options=transport_options,
            **kwargs,
        )
    sqs = request.getfixturevalue("sqs")
    transport_options = {
        "region": "us-east-1",
        "polling_interval": 0.2,
        "wait_time_seconds": 1,
        "visibility_timeout": 120,
        **transport_options,
    }
    return CeleryEnv.create(
        kind,
        broker_url=f"sqs://testing:testing@127.0.0.1:{sqs.port}",
        record_url=redis_server.url,
        unique=unique,
        store_url=redis_server.url,
        transport_options=transport_options,
        **kwargs,
    )
