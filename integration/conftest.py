"""Integration tests: real redis-server, rabbitmq-server and moto SQS server, started privately per session.

Every server is ours (free port, temporary directory) and is stopped at the end of the session. Tests use
namespaces and queue names of their own, so they never touch data they did not create.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from delay_broker.embedded import EmbeddedRedis

from .ha_servers import RedisClusterServers, SentinelSet, install_handlers
from .servers import AWS_TEST_ENV, MotoServer, PostgresServer, RabbitNode


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM to pytest (a CI job cancelled, scripts/test killed) becomes KeyboardInterrupt, so session fixtures
    # are torn down and every private rabbitmq-server, moto and redis-server is stopped.
    install_handlers()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    # scripts/matrix runs a smoke on other Redis versions by naming their redis-server binary here.
    with EmbeddedRedis(executable=os.environ.get("DELAY_BROKER_TEST_REDIS_SERVER")) as server:
        yield server


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitNode]:
    node = RabbitNode()
    try:
        yield node.start()
    finally:
        node.close()


@pytest.fixture(scope="session")
def sqs() -> Iterator[MotoServer]:
    for name, value in AWS_TEST_ENV.items():
        os.environ.setdefault(name, value)
    server = MotoServer()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def unique() -> str:
    """A fresh suffix for namespaces and queue names."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A private 3-master Redis Cluster (~2 s to start). Tests use keys and namespaces of their own."""
    with RedisClusterServers() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def redis_sentinel() -> Iterator[SentinelSet]:
    """A private master + replica + Sentinel (~0.2 s to start), shared by a module's tests.

    ``failover()`` returns only when the set is healthy again, so tests that fail over leave it usable; which node
    is master is not fixed: ask ``master_address()`` / ``master_client()``.
    """
    with SentinelSet() as sentinel:
        yield sentinel
