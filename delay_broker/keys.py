"""Redis key names of one delay store namespace.

Every key of a namespace carries the same Redis Cluster hash tag (``{namespace}``) so that each Lua script
touches a single slot. This module is the only place that spells key names.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "delay_broker"
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class Keyspace:
    """The key names of one namespace, e.g. ``delay_broker:{default}:due``."""

    namespace: str = DEFAULT_NAMESPACE
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        for label, value in (("namespace", self.namespace), ("prefix", self.prefix)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{label} must be a non-empty string, got {value!r}")
            if any(c in value for c in "{}") or any(c.isspace() for c in value):
                raise ValueError(f"{label} must not contain braces or white space, got {value!r}")

    def key(self, name: str) -> str:
        return f"{self.prefix}:{{{self.namespace}}}:{name}"

    @property
    def pattern(self) -> str:
        """A glob matching every key of this namespace (for ACLs and inspection)."""
        return f"{self.prefix}:{{{self.namespace}}}:*"

    def all(self) -> list[str]:
        """Every fixed key of the namespace (per-promoter stop markers expire by themselves)."""
        names = (
            "due",
            "msg",
            "inflight",
            "leased",
            "dead",
            "attempts",
            "errors",
            "seq",
            "wake",
            "stats",
            "promoters",
            "routes",
            "cron",
        )
        return [self.key(name) for name in names]

    @property
    def due(self) -> str:
        """ZSET id -> encoded due time (see :mod:`delay_broker.clock`)."""
        return self.key("due")

    @property
    def msg(self) -> str:
        """HASH id -> envelope bytes."""
        return self.key("msg")

    @property
    def inflight(self) -> str:
        """ZSET id -> lease deadline (ms) of messages claimed by an at-least-once promoter."""
        return self.key("inflight")

    @property
    def leased(self) -> str:
        """HASH id -> due score a claimed message had, so a lost lease gives it back unchanged."""
        return self.key("leased")

    @property
    def dead(self) -> str:
        """ZSET id -> time (ms) it was dead-lettered."""
        return self.key("dead")

    @property
    def attempts(self) -> str:
        """HASH id -> failed promotion attempts."""
        return self.key("attempts")

    @property
    def errors(self) -> str:
        """HASH id -> last promotion error (text)."""
        return self.key("errors")

    @property
    def seq(self) -> str:
        """STRING counter giving FIFO order to messages due in the same millisecond."""
        return self.key("seq")

    @property
    def wake(self) -> str:
        """LIST a sleeping promoter blocks on; pushed when a park moves the head earlier."""
        return self.key("wake")

    def wake_one(self, promoter_id: str) -> str:
        """LIST only one promoter blocks on, so it can be stopped without waking the others."""
        return self.key(f"wake:{promoter_id}")

    @property
    def stats(self) -> str:
        """HASH counter name -> total (parked, promoted, dead_lettered, ...)."""
        return self.key("stats")

    @property
    def routes(self) -> str:
        """SET of routes producers parked for (adapters whose queues are not all declared up front)."""
        return self.key("routes")

    @property
    def cron(self) -> str:
        """HASH schedule name -> due time (ms) of the latest occurrence parked for that recurring schedule."""
        return self.key("cron")

    @property
    def promoters(self) -> str:
        """ZSET promoter id -> last heartbeat (ms)."""
        return self.key("promoters")
