"""What promoters do with the store: claim, ack, renew and nack (at least once), promote straight into lists of
the same Redis (exactly once), and sleep until woken."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from redis.crc import key_slot

from ..clock import delay_to_ms, due_of_score
from ..envelope import Envelope
from ..errors import ConfigurationError, CorruptEnvelope, DelayBrokerError
from ..records import Claim, ClaimedMessage, DirectPromotion, NackAction, TracedPromotion
from ..redis_errors import slot_moving
from ..targets import ListTarget
from .migration import BRIEF_WAIT
from .replication import Replication
from .replies import check_batch, chunks, stored_id, text
from .runner import Runner
from .shards import ClusterFailure, Shards

MIGRATION_NAP = 0.1
"""Seconds a promoter sleeps in place of its blocking wait while shard 0's slot migrates (its wake lists cannot be
watched then)."""


MAX_AHEAD = 60.0
"""The most seconds before its due time a message may be promoted: its consumer holds it meanwhile."""


def ahead_to_ms(ahead: float) -> int:
    """A promoter's ``ahead`` (seconds) in ms, refused outside 0..MAX_AHEAD."""
    if not 0 <= ahead <= MAX_AHEAD:
        raise ValueError(f"ahead must be between 0 and {MAX_AHEAD:g} seconds, got {ahead!r}")
    return round(ahead * 1000)


def new_promoter_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Promotion:
    """The promoters' operations on the store.

    Parameters:
      max_attempts: promotion attempts before a message is dead-lettered.
      retry_backoff_ms: the first and the largest wait before a failed delivery is tried again.
    """

    def __init__(
        self,
        shards: Shards,
        runner: Runner,
        replication: Replication,
        max_attempts: int,
        retry_backoff_ms: tuple[int, int],
    ) -> None:
        self.shards = shards
        self.runner = runner
        self.replication = replication
        self.max_attempts = max_attempts
        self.retry_backoff_ms = retry_backoff_ms

    # -- at least once ---------------------------------------------------------------------------------

    def claim(self, batch: int, lease: float, promoter_id: str, shard: int, ahead: float) -> Claim:
        # Durable stores check for an in-sync replica first and do not WAIT after: a claim whose WAIT failed would
        # hold messages it never hands over until their lease expires and counts an attempt. A claim lost in a
        # failover only means a redelivery, which at-least-once allows; acks still WAIT.
        self.replication.require(shard, "claiming")
        ahead_ms = ahead_to_ms(ahead)
        args = [check_batch(batch), delay_to_ms(lease), self.max_attempts, promoter_id, ahead_ms]
        reply = self.runner.run("claim", shard, args, write=False, migration_wait=BRIEF_WAIT)
        messages = []
        dead_end = len(reply) - 2 * int(reply[3])
        for n in range(4, dead_end, 3):
            id, score, raw = reply[n].decode(), float(reply[n + 1]), reply[n + 2]
            try:
                envelope: Envelope | None = Envelope.decode(raw)
                problem = None
            except CorruptEnvelope as error:
                envelope, problem = None, str(error)
            messages.append(ClaimedMessage(id, due_of_score(score), raw, envelope, problem))
        next_wake = int(reply[2])
        dead = [(stored_id(reply[n]), text(reply[n + 1])) for n in range(dead_end, len(reply), 2)]
        return Claim(
            int(reply[0]), int(reply[1]), None if next_wake < 0 else next_wake, messages, shard, dead, ahead_ms
        )

    def ack(self, lease_deadline_ms: int, ids: Sequence[str], shard: int) -> int:
        return sum(int(self.runner.run("ack", shard, [lease_deadline_ms, *chunk])) for chunk in chunks(list(ids)))

    def renew(self, lease_deadline_ms: int, ids: Sequence[str], lease: float, shard: int) -> tuple[int, int]:
        if not ids:
            return lease_deadline_ms, 0
        reply = self.runner.run("renew", shard, [lease_deadline_ms, delay_to_ms(lease), *ids])
        return int(reply[0]), int(reply[1])

    def nack(self, lease_deadline_ms: int, failures: Sequence[tuple[str, str, NackAction]], shard: int) -> list[str]:
        outcomes: list[str] = []
        for chunk in chunks(list(failures)):
            args: list[Any] = [lease_deadline_ms, self.max_attempts, *self.retry_backoff_ms]
            for id, reason, action in chunk:
                if action not in ("retry", "dead", "release"):
                    raise ValueError(f"unknown nack action {action!r}")
                # An error's text may hold what UTF-8 cannot (a file name decoded with surrogateescape).
                args.extend((id, reason.encode("utf-8", "backslashreplace").decode(), action))
            reply = self.runner.run("nack", shard, args)
            self.shards.relay_wake(shard, reply[-1])
            outcomes.extend(("not held", "retried", "dead", "released")[int(code)] for code in reply[:-1])
        return outcomes

    # -- exactly once ----------------------------------------------------------------------------------

    def check_direct(self, routes: Mapping[str, ListTarget]) -> None:
        if not self.shards.cluster:
            return
        keys = self.shards.keys
        targets = sorted({key for target in routes.values() for key in (target.list_key, target.hash_key) if key})
        shards = len(self.shards.spaces)
        if shards > 1 and targets:
            raise ConfigurationError(
                f"exactly-once promotion cannot work on a Redis Cluster with shards={shards}: one script "
                "touches one slot, and the shards are in different slots. Use at-least-once promotion (a broker "
                "outside the cluster, or a deliverer of the framework)"
            )
        slot = key_slot(keys.due.encode())
        elsewhere = [key for key in targets if key_slot(key.encode()) != slot]
        if elsewhere:
            raise ConfigurationError(
                f"exactly-once promotion cannot work on this Redis Cluster: target key(s) {elsewhere} are not in "
                f"slot {slot} of {keys.pattern}, and one script touches one slot. Use at-least-once promotion "
                f"(a broker outside the cluster, or a deliverer of the framework) or give the targets the hash tag "
                f"{{{keys.tag}}}"
            )

    def promote_direct(
        self,
        routes: Mapping[str, ListTarget],
        batch: int,
        promoter_id: str,
        shard: int,
        lateness: bool,
        ahead: float,
    ) -> DirectPromotion:
        self.check_direct(routes)
        ahead_ms = ahead_to_ms(ahead)
        if not routes:
            return self._idle_look(shard, ahead_ms)
        self.replication.require(shard, "promoting")
        extra: list[str] = []
        args: list[Any] = [check_batch(batch), promoter_id, "1" if lateness else "", ahead_ms]
        for name, target in routes.items():
            extra.extend((target.list_key, target.hash_key or target.list_key))
            args.extend((name, target.mode))
        reply = self.runner.run("promote_list", shard, args, extra=extra, migration_wait=BRIEF_WAIT)
        next_due = int(reply[1])
        groups_end = 5 + 3 * int(reply[4])
        groups = reply[5:groups_end]
        by_task = {(text(groups[i]), text(groups[i + 1])): int(groups[i + 2]) for i in range(0, len(groups), 3)}
        traced_end = groups_end + 1 + 4 * int(reply[groups_end])
        entries = [text(value) for value in reply[groups_end + 1 : traced_end]]
        return DirectPromotion(
            now_ms=int(reply[0]),
            next_due_ms=None if next_due < 0 else next_due,
            promoted=int(reply[2]),
            dead_lettered=int(reply[3]),
            lateness_ms=[int(value) for value in reply[traced_end:]],
            shard=shard,
            by_task=by_task,
            traced=[TracedPromotion(*entries[i : i + 4]) for i in range(0, len(entries), 4)],
        )

    def _idle_look(self, shard: int, ahead_ms: int) -> DirectPromotion:
        """What a promotion with no route would see: nothing moved, the clock, and the shard's head while it is
        still ahead. An overdue head stays overdue until a route is declared, so it is no reason to look again
        at once: the promoter sleeps its ``max_idle`` instead of spinning."""
        snapshot = self.runner.run("stats", shard, [30_000], write=False, migration_wait=BRIEF_WAIT)
        now, head = int(snapshot[0]), int(snapshot[5]) - ahead_ms
        return DirectPromotion(now, head if head > now else None, 0, 0, [], shard)

    # -- sleeping and waking ---------------------------------------------------------------------------

    def wait_for_wake(self, timeout: float, promoter_id: str) -> frozenset[int] | None:
        spaces = self.shards.spaces
        client = self.shards.client
        timeout = max(timeout, 0.001)
        kwargs = client.get_connection_kwargs()
        # redis-py 8 leaves its default socket timeout (5 s) out of the kwargs of a pool made from a URL (such as
        # a Dramatiq RedisBroker's) and keeps it as orig_socket_timeout: a 5 s BLPOP would then time out.
        socket_timeout = kwargs["socket_timeout"] if "socket_timeout" in kwargs else kwargs.get("orig_socket_timeout")
        if socket_timeout:
            # Within the socket timeout with room for the reply, and never a mere millisecond: the promoter
            # blocks again until its wait is over, and a 1 ms BLPOP made that hundreds of calls a second.
            timeout = min(timeout, max(float(socket_timeout) - 1.0, float(socket_timeout) / 2))
        keys = [spaces[0].wake_one(promoter_id), spaces[0].wake]
        try:
            popped = client.blpop(keys, timeout=timeout)
        except ClusterFailure as error:
            if not (self.shards.cluster and slot_moving(error)):
                if isinstance(error, AttributeError):
                    raise
                raise self.shards.translated(error, f"BLPOP on the wake lists {keys}") from error
            # Shard 0's slot is migrating: two keys, one missing, are refused (TRYAGAIN) until it has moved. A
            # short nap instead of the wait: every shard is still looked at when its time comes.
            time.sleep(min(timeout, MIGRATION_NAP))
            return None
        if popped is None:
            return None
        return self.shards.woken_shards(popped[1])

    def wake(self, promoter_id: str) -> None:
        key = self.shards.keys.wake_one(promoter_id)
        with self.shards.calling("waking a promoter"):
            pipe = self.shards.client.pipeline(transaction=False)
            pipe.lpush(key, b"stop")
            pipe.expire(key, 60)
            pipe.execute()

    def forget_promoter(self, promoter_id: str) -> None:
        try:
            with self.shards.calling("forgetting a promoter"):  # redis-py's failure on an ASK as SlotMigrating too
                for space in self.shards.spaces:
                    self.shards.client.zrem(space.promoters, promoter_id)
                self.shards.client.delete(self.shards.keys.wake_one(promoter_id))
        except DelayBrokerError:
            pass  # it ages out of the heartbeat window anyway (and a stopping promoter must not raise)

    def eviction_policies(self) -> dict[str, str]:
        risky: dict[str, str] = {}
        for shard, space in enumerate(self.shards.spaces):
            try:
                reply = self.runner.run("memory_policy", shard, [], write=False)
            except DelayBrokerError:
                continue
            if len(reply) == 2 and int(reply[0]) and text(reply[1]) != "noeviction":
                kwargs = self.replication.shard_client(space).connection_pool.connection_kwargs  # Sentinel: no address
                server = f"{kwargs['host']}:{kwargs.get('port', 6379)}" if "host" in kwargs else f"of shard {shard}"
                risky[server] = text(reply[1])
        return risky


__all__ = ["Promotion", "new_promoter_id"]
