"""Targets in the store's own Redis that due messages can be moved into atomically (exactly once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PushMode = Literal["lpush", "rpush", "hash"]


@dataclass(frozen=True)
class ListTarget:
    """A Redis list a consumer pops from, optionally with a hash holding the payloads.

    - ``mode="lpush"``: the payload is LPUSHed (consumers BRPOP: a plain ready list, Celery's Redis
      transport).
    - ``mode="rpush"``: the payload is RPUSHed (consumers LPOP).
    - ``mode="hash"``: the payload goes to ``hash_key`` under the envelope's hash field and that field is
      RPUSHed to ``list_key`` (Dramatiq's RedisBroker: ``<ns>:<queue>.msgs`` and ``<ns>:<queue>``).
    """

    list_key: str
    mode: PushMode = "lpush"
    hash_key: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("lpush", "rpush", "hash"):
            raise ValueError(f"mode must be 'lpush', 'rpush' or 'hash', got {self.mode!r}")
        if (self.mode == "hash") != (self.hash_key is not None):
            raise ValueError("hash_key is required with mode='hash' and only then")
