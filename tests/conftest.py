"""Fast tests: one private redis-server per session; every test works in a namespace of its own."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from delay_broker import DelayStore
from delay_broker.embedded import EmbeddedRedis


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM to pytest becomes KeyboardInterrupt, so fixtures are torn down and each private redis-server is
    # stopped (Python's default would end the process and leave them running); also when only tests/ runs.
    from integration.ha_servers import install_handlers

    install_handlers()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    # scripts/matrix runs a smoke on other Redis versions by naming their redis-server binary here.
    with EmbeddedRedis(executable=os.environ.get("DELAY_BROKER_TEST_REDIS_SERVER")) as server:
        yield server


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    connection = redis_server.client()
    yield connection
    connection.close()


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(client: redis.Redis, namespace: str) -> DelayStore:
    return DelayStore(client, namespace=namespace, retry_backoff=(0.05, 0.2), max_attempts=3)


@pytest.fixture
def ready_key(namespace: str) -> str:
    """A target list of this test's own (consumers BRPOP it)."""
    return f"{namespace}:jobs:ready"
