"""What the run, its workers and its producers agree on: environment variables, result keys, record format."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import redis

ENV_RUN = "CHAOS_RUN"
ENV_LANE = "CHAOS_LANE"
ENV_BROKER = "CHAOS_BROKER"
ENV_BROKER_URL = "CHAOS_BROKER_URL"
ENV_STORE_URL = "CHAOS_STORE_URL"
ENV_RESULTS_URL = "CHAOS_RESULTS_URL"
ENV_LEASE = "CHAOS_LEASE"
ENV_BATCH = "CHAOS_BATCH"
ENV_ONCE = "CHAOS_ONCE"
"""Set (to "1") on the at-least-once lanes of a run with effectively-once execution (OnceMiddleware)."""

THRESHOLD_S = 1.0
"""Every delay of the run is above it: every message is parked."""


def now_ms() -> int:
    return int(time.time() * 1000)


def sent_key(run: str, lane: str) -> str:
    """List of ``"<id> <due ms>"``: messages whose send the framework acknowledged."""
    return f"chaos:{run}:sent:{lane}"


def ran_key(run: str, lane: str) -> str:
    """List of ``"<id> <due ms> <ran ms> <pid>"``: one entry per execution of the task body."""
    return f"chaos:{run}:ran:{lane}"


@dataclass(frozen=True)
class Run:
    """One execution of a task body, as the body recorded it."""

    id: str
    due_ms: int
    ran_ms: int
    pid: int

    @classmethod
    def parse(cls, line: bytes | str) -> Run:
        text = line.decode() if isinstance(line, bytes) else line
        id, due, ran, pid = text.split(" ")
        return cls(id, int(due), int(ran), int(pid))


class Recorder:
    """What a task body calls: one RPUSH per execution, before the framework acknowledges the message."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.client = redis.Redis.from_url(env[ENV_RESULTS_URL], socket_timeout=10)
        self.key = ran_key(env[ENV_RUN], env[ENV_LANE])

    def __call__(self, id: str, due_ms: int) -> None:
        self.client.rpush(self.key, f"{id} {due_ms} {now_ms()} {os.getpid()}")


def namespace(env: Mapping[str, str]) -> str:
    """The broker and store namespace (and queue name) of a lane in a run."""
    return f"chaos-{env[ENV_RUN]}-{env[ENV_LANE]}"
