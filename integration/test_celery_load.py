"""Two workers, each with the promoter bootstep, and 2,000 parked tasks (SQS: 500) due within a few seconds.

Redis (direct promotion): every task runs exactly once. RabbitMQ and SQS (at-least-once republish): none is
lost; duplicates are reported (printed) and expected to be zero in a run without crashes.
"""

from __future__ import annotations

import random
import time
import uuid

import pytest

from .celery_apps.brokers import env_for
from .celery_apps.harness import wait_for

# moto answers one call at a time: on SQS a quarter of the load shows the same and spares CI two minutes.
TASKS = {"redis": 2000, "amqp": 2000, "sqs": 500}


@pytest.mark.timeout(900)  # workers and moto start-up count too; the default 300 s is tight on 2 cores
@pytest.mark.parametrize("kind", ["redis", "amqp", "sqs"])
def test_two_workers_run_thousands_of_parked_tasks(request: pytest.FixtureRequest, kind: str) -> None:
    tasks = TASKS[kind]
    env = env_for(kind, request, uuid.uuid4().hex[:10], options={"batch": 200})
    try:
        env.start_worker("w1", concurrency=4)
        env.start_worker("w2", concurrency=4)
        record = env.task("record")
        started = time.monotonic()
        ids = {record.apply_async(("load",), countdown=3 + random.random() * 3).id for _ in range(tasks)}
        sent = time.monotonic() - started
        # Counted at park time: the workers' promoters may already be promoting the first ones.
        assert env.store.stats().counters["parked"] == tasks
        # moto answers one SendMessage at a time and is slow on a busy machine: SQS gets more time.
        timeout = 240 if kind == "sqs" else 90
        wait_for(lambda: len(set(env.run_counts()) & ids) == tasks, timeout, interval=0.5, what="all tasks ran")
        time.sleep(2)
        counts = env.run_counts()
        duplicates = sum(n - 1 for task_id, n in counts.items() if task_id in ids and n > 1)
        print(
            f"\n{kind}: {tasks} tasks sent in {sent:.1f} s, all ran after {time.monotonic() - started:.1f} s, "
            f"duplicates: {duplicates}"
        )
        assert set(counts) >= ids, "lost tasks"
        if kind == "redis":
            assert duplicates == 0
    finally:
        env.close()
