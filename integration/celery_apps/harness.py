"""Test harness: a Celery app per test environment, real ``celery worker`` processes, execution records."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from delay_broker import DelayStore
from delay_broker.connect import AnyRedis, client_from_url
from tests.helpers import wait_for as shared_wait_for

from .app import make_app

ROOT = Path(__file__).resolve().parents[2]
TRANSPORTS = {
    "redis": "delay_broker.celery.transport:RedisTransport",
    "amqp": "delay_broker.celery.transport:AmqpTransport",
    "sqs": "delay_broker.celery.transport:SQSTransport",
}


wait_for = functools.partial(shared_wait_for, interval=0.1)


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@dataclass
class CeleryEnv:
    """One test environment: broker, queue, namespace and record key of its own."""

    kind: str
    env: dict[str, str]
    recorder: redis.Redis
    store_client: AnyRedis
    workers: list[Worker] = field(default_factory=list)
    _app: Celery | None = None

    @classmethod
    def create(
        cls,
        kind: str,
        *,
        broker_url: str,
        record_url: str,
        unique: str,
        options: dict[str, Any] | None = None,
        transport_options: dict[str, Any] | None = None,
        wrapped: bool = True,
        store_url: str | None = None,
    ) -> CeleryEnv:
        delay_options: dict[str, Any] = {"threshold": 1.0, "namespace": f"celery-{unique}", "max_idle": 1.0}
        if store_url is not None:
            delay_options["redis_url"] = store_url
        delay_options.update(options or {})
        all_options: dict[str, Any] = dict(transport_options or {})
        if wrapped:
            all_options["delay_broker"] = delay_options
        env = {
            "DBT_BROKER_URL": broker_url,
            "DBT_TRANSPORT": TRANSPORTS[kind] if wrapped else "",
            "DBT_OPTIONS": json.dumps(all_options),
            "DBT_QUEUE": f"q-{unique}",
            "DBT_RECORD_URL": record_url,
            "DBT_RECORD_KEY": f"dbtest:{unique}:runs",
        }
        recorder = redis.Redis.from_url(record_url)
        return cls(kind, env, recorder, client_from_url(store_url or record_url))

    @property
    def queue(self) -> str:
        return self.env["DBT_QUEUE"]

    @property
    def app(self) -> Celery:
        if self._app is None:
            self._app = make_app(self.env)
        return self._app

    def task(self, name: str) -> Any:
        return self.app.tasks[f"dbtest.{name}"]

    @property
    def store(self) -> DelayStore:
        namespace = json.loads(self.env["DBT_OPTIONS"])["delay_broker"]["namespace"]
        return DelayStore(self.store_client, namespace=namespace)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.recorder.lrange(self.env["DBT_RECORD_KEY"], 0, -1)]

    def runs(self, task_id: str) -> list[dict[str, Any]]:
        return [record for record in self.records() if record["id"] == task_id]

    def run_counts(self) -> Counter[str]:
        return Counter(record["id"] for record in self.records())

    def start_worker(self, name: str = "w1", concurrency: int = 4, extra: list[str] | None = None) -> Worker:
        log = Path(tempfile.mkstemp(prefix=f"celery-{self.kind}-{name}-", suffix=".log")[1])
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "integration.celery_apps.app",
            "worker",
            "--pool",
            "threads",
            "-c",
            str(concurrency),
            "-l",
            "INFO",
            "-n",
            f"{name}-{self.queue}@%h",
            "--without-gossip",
            "--without-mingle",
            *(extra or []),
        ]
        with open(log, "ab") as output:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, **self.env, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(process, log)
        self.workers.append(worker)

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"worker exited with {process.returncode}:\n{worker.text()[-4000:]}")
            return " ready." in worker.text()

        wait_for(ready, 60, what=f"worker {name} ready")
        return worker

    def queue_depth(self) -> int:
        """Messages waiting in the broker queue (ready or, on SQS, in flight)."""
        if self.kind == "redis":
            prefix = json.loads(self.env["DBT_OPTIONS"]).get("global_keyprefix", "")
            client = redis.Redis.from_url(self.env["DBT_BROKER_URL"])
            keys = [f"{prefix}{self.queue}"] + [f"{prefix}{self.queue}\x06\x16{step}" for step in (3, 6, 9)]
            return sum(int(client.llen(key)) for key in keys)
        if self.kind == "amqp":
            with self.app.connection_for_write() as connection:
                declared = connection.default_channel.queue_declare(queue=self.queue, passive=True)
                return int(declared.message_count)
        import boto3

        options = json.loads(self.env["DBT_OPTIONS"])
        endpoint = "http://" + self.env["DBT_BROKER_URL"].split("@", 1)[1]
        sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=options.get("region", "us-east-1"))
        url = sqs.get_queue_url(QueueName=options.get("queue_name_prefix", "") + self.queue)["QueueUrl"]
        attributes = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
            worker.log.unlink(missing_ok=True)
        self.recorder.delete(self.env["DBT_RECORD_KEY"])
        with contextlib.suppress(Exception):
            for space in self.store.shards:  # one slot per shard: a Cluster takes each delete
                self.store_client.delete(*space.all())
        if self._app is not None:
            self._app.close()
