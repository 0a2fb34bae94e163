"""A park on SQS is held to the queue's own ``MaximumMessageSize``, not only to the client's 1 MiB: on moto in
server mode, with real Dramatiq (``SQSBroker``) and Celery (kombu's SQS transport) producers.

A queue created before AWS raised the limit to 1 MiB keeps 262144 bytes. SQS refuses a plain send over it at
once; a park over it used to be accepted and dead-lettered when due. The attribute is read once per queue, and
a producer that may not read it (no ``sqs:GetQueueAttributes``) parks as before, with one warning.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import boto3
import dramatiq
import pytest
from botocore.exceptions import ClientError
from celery import Celery

from delay_broker.celery import get as celery_get
from delay_broker.dramatiq import DelayMiddleware
from delay_broker.dramatiq.delays import sqs_too_large
from delay_broker.embedded import EmbeddedRedis
from delay_broker.errors import PayloadTooLarge

from .servers import MotoServer

OLD_LIMIT = 262_144
"""SQS's limit until August 2025, and what the queues created before keep."""


def counted(client: Any) -> list[str]:
    """The reads of a queue's MaximumMessageSize ``client`` makes from now on (botocore's own events). kombu
    reads other attributes of its own (``queue_declare`` asks for the queue's size)."""
    calls: list[str] = []

    def seen(params: dict[str, Any], **kwargs: Any) -> None:
        if "MaximumMessageSize" in params.get("AttributeNames", ()):
            calls.append("read")

    client.meta.events.register("before-parameter-build.sqs.GetQueueAttributes", seen)
    return calls


class DramatiqProducer:
    def __init__(self, endpoint: str, redis_url: str, queue: str, **credentials: str) -> None:
        from dramatiq_sqs import SQSBroker

        self.broker = SQSBroker(namespace="lim", endpoint_url=endpoint, region_name="us-east-1", **credentials)
        self.middleware = DelayMiddleware(redis_url=redis_url, namespace=f"lim-{queue}")
        self.broker.add_middleware(self.middleware)
        self.actor = dramatiq.actor(broker=self.broker, queue_name=queue, actor_name=f"record_{queue}")(
            lambda blob: None
        )
        self.reads = counted(self.broker.sqs.meta.client)
        self.refused: type[Exception] = sqs_too_large()
        # Arguments of N characters: about 4/3 N bytes once base64-encoded. Over 262,144 and under it, both
        # far under the client's 1 MiB.
        self.large, self.small = 250_000, 150_000

    @staticmethod
    def sqs_name(queue: str) -> str:
        return f"lim_{queue}"

    def send(self, size: int, *, delay: timedelta | None) -> bool:
        """True if parked; raises what the send raised."""
        message = self.actor.send_with_options(args=("x" * size,), delay=delay)
        return self.middleware.get(message) is not None

    def close(self) -> None:
        self.broker.close()


class CeleryProducer:
    def __init__(self, endpoint: str, redis_url: str, queue: str, **credentials: str) -> None:
        key = quote(credentials.get("aws_access_key_id", "testing"), safe="")
        secret = quote(credentials.get("aws_secret_access_key", "testing"), safe="")
        self.app = Celery("limits", broker=f"sqs://{key}:{secret}@{endpoint.split('://', 1)[1]}")
        self.app.conf.broker_transport = "delay_broker.celery.transport:SQSTransport"
        self.app.conf.broker_transport_options = {
            "region": "us-east-1",
            "delay_broker": {"redis_url": redis_url, "namespace": f"lim-{queue}"},
        }
        self.app.conf.task_default_queue = queue

        def record(blob: str) -> None:  # never run: no worker here
            pass

        self.task = self.app.task(name="limits.record", shared=False)(record)
        self.refused = PayloadTooLarge
        # About 16/9 N bytes: the task's body is base64 inside the message, and the message base64 again.
        self.large, self.small = 170_000, 100_000
        # One producer for every send, so the client whose calls are counted is the one that sends.
        self.producer = self.app.producer_pool.acquire(block=True)
        self.reads = counted(self.producer.channel.sqs())

    @staticmethod
    def sqs_name(queue: str) -> str:
        return queue

    def send(self, size: int, *, delay: timedelta | None) -> bool:
        countdown = delay.total_seconds() if delay is not None else None
        result = self.task.apply_async(("x" * size,), countdown=countdown, producer=self.producer)
        return celery_get(self.app, result.id) is not None

    def close(self) -> None:
        self.producer.release()
        self.app.close()


PRODUCERS = {"dramatiq": DramatiqProducer, "celery": CeleryProducer}


def create_old_queue(endpoint: str, name: str, limit: int = OLD_LIMIT, **credentials: str) -> None:
    client = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1", **credentials)
    # The retention dramatiq-sqs asks for: before 0.4 it creates every queue it declares, and SQS refuses to
    # create an existing queue with other attributes.
    attributes = {"MaximumMessageSize": str(limit), "MessageRetentionPeriod": str(14 * 86400)}
    client.create_queue(QueueName=name, Attributes=attributes)


@pytest.mark.parametrize("kind", PRODUCERS)
def test_a_park_is_held_to_the_queues_own_maximum_message_size(
    kind: str, sqs: MotoServer, redis_server: EmbeddedRedis
) -> None:
    queue = f"old{uuid.uuid4().hex[:8]}"
    make = PRODUCERS[kind]
    create_old_queue(sqs.endpoint_url, make.sqs_name(queue))  # before dramatiq-sqs 0.2 to 0.3 create it
    producer = make(sqs.endpoint_url, redis_server.url, queue)
    try:
        # SQS itself refuses the plain send (dramatiq-sqs 0.2 before it: its own limit was 256 KiB).
        with pytest.raises((ClientError, producer.refused)):
            producer.send(producer.large, delay=None)
        with pytest.raises(producer.refused, match=f"{OLD_LIMIT:,}|{OLD_LIMIT}"):
            producer.send(producer.large, delay=timedelta(hours=6))
        # Under the queue's limit: parked, as a plain send is accepted.
        assert producer.send(producer.small, delay=timedelta(hours=6))
        assert producer.send(producer.small, delay=timedelta(hours=7))
        assert not producer.send(producer.small, delay=None)
        assert producer.reads == ["read"], "the queue's attributes are read once for all its parks"
    finally:
        producer.close()


@pytest.fixture
def iam_sqs() -> Iterator[tuple[MotoServer, dict[str, str]]]:
    """A moto server that enforces IAM, and the credentials of a user who may send but not read attributes."""
    # The first 3 calls (the setup below) go unchecked; every later one needs an allowed, real access key.
    server = MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    server.start()
    try:
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        iam.create_user(UserName="sender")
        actions = ["sqs:CreateQueue", "sqs:GetQueueUrl", "sqs:ListQueues", "sqs:SendMessage", "sqs:TagQueue"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
        iam.put_user_policy(UserName="sender", PolicyName="send-only", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="sender")["AccessKey"]
        yield server, {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
    finally:
        server.close()


def test_without_permission_to_read_the_limit_a_park_goes_on_with_one_warning(
    iam_sqs: tuple[MotoServer, dict[str, str]], redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Dramatiq only: kombu's own ``queue_declare`` calls GetQueueAttributes, so a Celery producer without that
    permission cannot send at all."""
    server, credentials = iam_sqs
    queue = f"old{uuid.uuid4().hex[:8]}"
    make = DramatiqProducer
    # 64 KiB: under every dramatiq-sqs version's own limit (256 KiB in 0.2), so the fall-back to it shows.
    create_old_queue(server.endpoint_url, make.sqs_name(queue), 65_536, **credentials)
    producer = make(server.endpoint_url, redis_server.url, queue, **credentials)
    try:
        with caplog.at_level(logging.WARNING, logger="delay_broker.sqs"):
            # Over the queue's limit, which cannot be read: checked against the client's own limit only.
            assert producer.send(100_000, delay=timedelta(hours=6))
            assert producer.send(30_000, delay=timedelta(hours=6))
        warnings = [record.getMessage() for record in caplog.records if record.name == "delay_broker.sqs"]
        assert len(warnings) == 1 and "sqs:GetQueueAttributes" in warnings[0], warnings
        assert producer.reads == ["read"], "denied once, not asked again at every park"
    finally:
        producer.close()
