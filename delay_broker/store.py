"""The delay store: parked messages in Redis and the atomic operations on them.

The store knows ids, due times and envelopes; it knows nothing of Dramatiq or Celery. Every operation is one
Lua script (see ``delay_broker/scripts``), so each is atomic and costs one round trip.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import redis

from . import scripts
from .clock import MAX_DUE_MS, Delay, delay_to_ms, due_of_score, due_to_ms, score_ceiling, score_floor
from .envelope import Envelope
from .errors import (
    CorruptEnvelope,
    DelayBrokerError,
    InvalidDelay,
    InvalidMessage,
    PayloadTooLarge,
    StoreUnavailable,
)
from .keys import DEFAULT_NAMESPACE, DEFAULT_PREFIX, Keyspace
from .targets import ListTarget

MAX_BATCH = 1000
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 30.0,
    "socket_keepalive": True,
    "health_check_interval": 30,
}
"""Client settings for stores made from a URL: fail fast when Redis is unreachable, notice dead peers."""
MAX_ID_LENGTH = 512
DEFAULT_MAX_PAYLOAD = 1024 * 1024

OnConflict = Literal["replace", "keep"]
State = Literal["due", "inflight", "dead", "gone"]
NackAction = Literal["retry", "dead", "release"]


@dataclass(frozen=True)
class ParkRequest:
    """One message to park: exactly one of ``delay`` (seconds or timedelta) and ``due`` (aware datetime)."""

    id: str
    envelope: Envelope
    delay: Delay | None = None
    due: datetime | None = None


@dataclass(frozen=True)
class ParkResult:
    id: str
    due_ms: int
    """The due time now stored (for a kept duplicate: the existing one; -1 if it is in flight or dead)."""
    outcome: Literal["new", "replaced", "kept"]


@dataclass(frozen=True)
class ClaimedMessage:
    """A message leased to a promoter. ``envelope`` is None when the stored bytes are corrupt."""

    id: str
    due_ms: int
    raw: bytes
    envelope: Envelope | None
    problem: str | None = None


@dataclass(frozen=True)
class Claim:
    now_ms: int
    lease_deadline_ms: int
    next_wake_ms: int | None
    messages: list[ClaimedMessage]


@dataclass(frozen=True)
class DirectPromotion:
    now_ms: int
    next_due_ms: int | None
    promoted: int
    dead_lettered: int
    lateness_ms: list[int]


@dataclass(frozen=True)
class MessageInfo:
    """What the store holds for one id."""

    id: str
    state: State
    due_ms: int | None
    at_ms: int | None
    """Lease deadline (in flight) or time it was dead-lettered (dead)."""
    raw: bytes | None
    attempts: int
    error: str | None

    @property
    def envelope(self) -> Envelope | None:
        if self.raw is None:
            return None
        try:
            return Envelope.decode(self.raw)
        except CorruptEnvelope:
            return None


@dataclass(frozen=True)
class Requeued:
    count: int
    """Dead letters parked again."""
    not_requeued: list[str]
    """Ids given (or found) that were not: not dead-lettered, or with no payload to requeue."""


@dataclass(frozen=True)
class StoreStats:
    now_ms: int
    parked: int
    inflight: int
    dead: int
    overdue: int
    next_due_ms: int | None
    live_promoters: int
    counters: dict[str, int]
    histogram: list[int]
    """Parked messages per bucket of :attr:`DelayStore.HISTOGRAM_EDGES`, plus one for later."""

    @property
    def oldest_overdue_age_ms(self) -> int:
        if self.overdue == 0 or self.next_due_ms is None:
            return 0
        return max(0, self.now_ms - self.next_due_ms)


def new_promoter_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class DelayStore:
    """Parked messages of one namespace in one Redis.

    Parameters:
      client: a redis-py client that returns bytes (``decode_responses=False``, the default).
      namespace: separates independent stores in one Redis; every key carries it as a hash tag.
      max_payload_bytes: larger payloads are refused at park time.
      max_attempts: promotion attempts (failed deliveries or lost leases) before a message is dead-lettered.
      retry_backoff: first and largest wait, in seconds, before a failed delivery is tried again.
    """

    HISTOGRAM_EDGES = (60_000, 3_600_000, 86_400_000)
    """Stats buckets: due within a minute, an hour, a day; the last bucket counts everything later."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        prefix: str = DEFAULT_PREFIX,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        max_attempts: int = 5,
        retry_backoff: tuple[float, float] = (1.0, 300.0),
    ) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise DelayBrokerError("the Redis client must return bytes: create it with decode_responses=False")
        if max_payload_bytes <= 0 or max_attempts < 1:
            raise ValueError("max_payload_bytes and max_attempts must be positive")
        self.client = client
        self.keys = Keyspace(namespace, prefix)
        self.max_payload_bytes = max_payload_bytes
        self.max_attempts = max_attempts
        self.retry_backoff_ms = (delay_to_ms(retry_backoff[0]), delay_to_ms(retry_backoff[1]))
        self._scripts = {name: client.register_script(scripts.source(name)) for name in scripts.NAMES}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DelayStore:
        """A store on a new client for ``url`` (``redis://``, ``rediss://`` or ``unix://``).

        Options this class takes (``namespace``, ``max_attempts``, ...) configure the store; every other one
        goes to :meth:`redis.Redis.from_url` (``ssl_ca_certs``, ``username``, ``socket_timeout``, ...).
        """
        store_options = ("namespace", "prefix", "max_payload_bytes", "max_attempts", "retry_backoff")
        client_options = {key: options.pop(key) for key in list(options) if key not in store_options}
        client = redis.Redis.from_url(url, **{**CLIENT_DEFAULTS, **client_options})
        return cls(client, **options)

    @contextlib.contextmanager
    def _redis(self, doing: str) -> Iterator[None]:
        """Redis errors as delay_broker's: unreachable -> StoreUnavailable, refused -> DelayBrokerError."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise StoreUnavailable(f"Redis unavailable during {doing}: {error}") from error
        except redis.ResponseError as error:
            # The scripts' own input errors start with "delay_broker:"; anything else (a key of the wrong type,
            # a missing permission) is reported as Redis said it, with the key names it gave.
            if str(error).startswith("delay_broker:"):
                raise InvalidDelay(str(error).split("delay_broker:", 1)[1].strip()) from None
            raise DelayBrokerError(f"Redis refused {doing}: {error}") from error

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with self._redis(name):
            return self._scripts[name](keys=keys, args=args)

    # -- producers -------------------------------------------------------------------------------------

    def park(
        self,
        id: str,
        envelope: Envelope,
        *,
        delay: Delay | None = None,
        due: datetime | None = None,
        on_conflict: OnConflict = "replace",
    ) -> ParkResult:
        """Park one message until ``delay`` from now (Redis clock) or until ``due``.

        ``on_conflict="replace"`` (debounce) gives an id that is already stored the new payload and due time;
        ``"keep"`` (dedup) leaves the stored one alone and reports it as kept.
        """
        return self.park_many([ParkRequest(id, envelope, delay=delay, due=due)], on_conflict=on_conflict)[0]

    def park_many(self, requests: Iterable[ParkRequest], *, on_conflict: OnConflict = "replace") -> list[ParkResult]:
        """Park many messages: one round trip per 1000, each chunk all or nothing.

        Every request is validated before anything is written.
        """
        if on_conflict not in ("replace", "keep"):
            raise ValueError(f"on_conflict must be 'replace' or 'keep', got {on_conflict!r}")
        encoded = [self._encode_request(request) for request in requests]
        results: list[ParkResult] = []
        for start in range(0, len(encoded), MAX_BATCH):
            results.extend(self._park(encoded[start : start + MAX_BATCH], on_conflict))
        return results

    def park_occurrence(self, schedule: str, id: str, envelope: Envelope, due: datetime) -> ParkResult:
        """Park one occurrence of the recurring schedule ``schedule``, due at ``due``.

        It is parked only if it is due later than every occurrence ever parked for that schedule, so any
        number of schedulers may offer it, before or after it was promoted, and it runs once. Otherwise the
        result is ``kept``, with the due time of the latest occurrence parked for the schedule.
        """
        if not isinstance(schedule, str) or not schedule:
            raise ValueError(f"schedule must be a non-empty string, got {schedule!r}")
        return self._park([self._encode_request(ParkRequest(id, envelope, due=due))], "keep", schedule)[0]

    def _park(
        self, chunk: list[tuple[str, str, int, bytes]], on_conflict: OnConflict, schedule: str = ""
    ) -> list[ParkResult]:
        args: list[Any] = [on_conflict, MAX_DUE_MS, schedule]
        for item in chunk:
            args.extend(item)
        reply = self._run("park", self._park_keys, args)
        outcomes: tuple[Literal["kept", "new", "replaced"], ...] = ("kept", "new", "replaced")
        return [ParkResult(item[0], int(reply[2 * n]), outcomes[int(reply[2 * n + 1])]) for n, item in enumerate(chunk)]

    @property
    def _park_keys(self) -> list[str]:
        k = self.keys
        return [k.due, k.msg, k.inflight, k.leased, k.dead, k.attempts, k.errors, k.seq, k.wake, k.stats, k.cron]

    def _encode_request(self, request: ParkRequest) -> tuple[str, str, int, bytes]:
        check_id(request.id)
        kind, value = _due_argument(request.delay, request.due, request.id)
        return request.id, kind, value, self._encode_envelope(request.id, request.envelope)

    def _encode_envelope(self, id: str, envelope: Envelope) -> bytes:
        if not isinstance(envelope.payload, bytes):
            raise InvalidMessage(f"payload must be bytes, got {type(envelope.payload).__name__}")
        if len(envelope.payload) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload of {id!r} is {len(envelope.payload)} bytes, over the limit of {self.max_payload_bytes}"
            )
        return envelope.encode(parked_at_ms=int(time.time() * 1000))

    def cancel(self, id: str) -> bool:
        """Remove a parked (or dead-lettered) message. False if it is unknown, gone or being promoted."""
        return self.cancel_many([id]) == 1

    def cancel_many(self, ids: Sequence[str]) -> int:
        total = 0
        k = self.keys
        for chunk in _chunks([check_id(id) for id in ids]):
            reply = self._run("cancel", [k.due, k.msg, k.dead, k.attempts, k.errors, k.stats], chunk)
            total += sum(int(flag) for flag in reply)
        return total

    def reschedule(
        self,
        id: str,
        *,
        delay: Delay | None = None,
        due: datetime | None = None,
        envelope: Envelope | None = None,
    ) -> int | None:
        """Move a parked message to a new due time (``delay=0``: due now). Returns the new due time in ms,
        or None if the id is not parked (unknown, already promoted, in flight or dead).

        ``envelope`` replaces the stored one in the same atomic step (for payloads that carry their own
        due time, such as a Celery message's ``eta`` header).
        """
        check_id(id)
        kind, value = _due_argument(delay, due, id)
        encoded = b"" if envelope is None else self._encode_envelope(id, envelope)
        k = self.keys
        reply = int(self._run("reschedule", [k.due, k.seq, k.wake, k.msg], [id, kind, value, MAX_DUE_MS, encoded]))
        return None if reply < 0 else reply

    def now_ms(self) -> int:
        """The Redis server's clock, by which every due time is kept."""
        with self._redis("TIME"):
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def record_routes(self, routes: Iterable[str]) -> None:
        """Remember routes producers parked for, so promoters in other processes may deliver to them.

        Adapters whose queues are not all declared up front (a Celery producer may route anywhere) record
        each route when they park; promoters allow declared routes plus these.
        """
        names = [route for route in routes if isinstance(route, str) and route]
        if names:
            with self._redis("recording routes"):
                self.client.sadd(self.keys.routes, *names)

    def recorded_routes(self) -> set[str]:
        with self._redis("reading routes"):
            members = self.client.smembers(self.keys.routes)
        return {_text(member) for member in members}

    def schedules(self) -> dict[str, int | None]:
        """Recurring schedules that parked an occurrence: name -> due time (ms) of the latest one (None when
        the record is malformed)."""
        with self._redis("reading schedules"):
            records = self.client.hgetall(self.keys.cron)
        return {_text(name): _int_or_none(value) for name, value in records.items()}

    def forget_schedule(self, name: str) -> bool:
        """Drop the record of a recurring schedule (its occurrences already parked stay parked)."""
        with self._redis("forgetting a schedule"):
            return bool(self.client.hdel(self.keys.cron, name))

    # -- inspection ------------------------------------------------------------------------------------

    def get(self, id: str) -> MessageInfo | None:
        check_id(id)
        k = self.keys
        state, due, at, raw, attempts, error = self._run(
            "get", [k.due, k.inflight, k.dead, k.msg, k.attempts, k.errors, k.leased], [id]
        )
        state = state.decode()
        if state == "gone" and not raw:
            return None
        return MessageInfo(
            id=id,
            state=state,
            due_ms=None if int(due) < 0 else int(due),
            at_ms=None if int(at) < 0 else int(at),
            raw=raw or None,
            attempts=int(attempts),
            error=_text(error) if error else None,
        )

    def list_messages(
        self,
        state: Literal["due", "inflight", "dead"] = "due",
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
        offset: int = 0,
        count: int = 100,
    ) -> list[MessageInfo]:
        """A page of messages in one state, oldest first: parked by due time, in flight by lease deadline,
        dead by when they were dead-lettered. ``start_ms``/``end_ms`` bound that time (inclusive)."""
        if not 0 < count <= MAX_BATCH or offset < 0:
            raise ValueError(f"count must be 1..{MAX_BATCH} and offset >= 0")
        k = self.keys
        index = {"due": k.due, "inflight": k.inflight, "dead": k.dead}[state]
        if state == "due":
            low = "-inf" if start_ms is None else score_floor(start_ms)
            high = "+inf" if end_ms is None else score_ceiling(end_ms)
        else:
            low = "-inf" if start_ms is None else start_ms
            high = "+inf" if end_ms is None else end_ms
        reply = self._run("list", [index, k.msg, k.attempts, k.errors], [low, high, offset, count])
        infos = []
        for n in range(0, len(reply), 5):
            id, score, raw, attempts, error = reply[n : n + 5]
            score = float(score)
            infos.append(
                MessageInfo(
                    id=id.decode(),
                    state=state,
                    due_ms=due_of_score(score) if state == "due" else None,
                    at_ms=None if state == "due" else int(score),
                    raw=raw or None,
                    attempts=int(attempts),
                    error=_text(error) if error else None,
                )
            )
        return infos

    def iter_all(self, state: Literal["due", "inflight", "dead"] = "due", page: int = 500) -> Iterator[MessageInfo]:
        """Every message of a state, page by page (not a snapshot: changes meanwhile may be missed)."""
        offset = 0
        while True:
            infos = self.list_messages(state, offset=offset, count=page)
            yield from infos
            if len(infos) < page:
                return
            offset += page

    def stats(self, heartbeat_window: float = 30.0) -> StoreStats:
        k = self.keys
        reply = self._run(
            "stats",
            [k.due, k.inflight, k.dead, k.stats, k.promoters],
            [delay_to_ms(heartbeat_window), *self.HISTOGRAM_EDGES],
        )
        now, parked, inflight, dead, overdue, head, live, counters, histogram = reply
        pairs = iter(counters)
        return StoreStats(
            now_ms=int(now),
            parked=int(parked),
            inflight=int(inflight),
            dead=int(dead),
            overdue=int(overdue),
            next_due_ms=None if int(head) < 0 else int(head),
            live_promoters=int(live),
            counters={name.decode(): int(value) for name, value in zip(pairs, pairs, strict=True)},
            histogram=[int(count) for count in histogram],
        )

    # -- promoters -------------------------------------------------------------------------------------

    def claim(self, batch: int, lease: float, promoter_id: str) -> Claim:
        """Lease up to ``batch`` due messages for ``lease`` seconds (at-least-once promotion).

        Expired leases of other promoters are given back first. Deliver each message, then :meth:`ack` it
        (or :meth:`nack` it) with the claim's ``lease_deadline_ms`` before the lease runs out.
        """
        k = self.keys
        reply = self._run(
            "claim",
            [k.due, k.msg, k.inflight, k.leased, k.dead, k.attempts, k.errors, k.stats, k.promoters],
            [_batch(batch), delay_to_ms(lease), self.max_attempts, promoter_id],
        )
        messages = []
        for n in range(3, len(reply), 3):
            id, score, raw = reply[n].decode(), float(reply[n + 1]), reply[n + 2]
            try:
                envelope: Envelope | None = Envelope.decode(raw)
                problem = None
            except CorruptEnvelope as error:
                envelope, problem = None, str(error)
            messages.append(ClaimedMessage(id, due_of_score(score), raw, envelope, problem))
        next_wake = int(reply[2])
        return Claim(int(reply[0]), int(reply[1]), None if next_wake < 0 else next_wake, messages)

    def ack(self, lease_deadline_ms: int, ids: Sequence[str]) -> int:
        """Forget delivered messages whose lease (identified by its deadline) this promoter still holds."""
        k = self.keys
        total = 0
        for chunk in _chunks(list(ids)):
            total += int(
                self._run(
                    "ack",
                    [k.inflight, k.msg, k.leased, k.attempts, k.errors, k.stats],
                    [lease_deadline_ms, *chunk],
                )
            )
        return total

    def nack(self, lease_deadline_ms: int, failures: Sequence[tuple[str, str, NackAction]]) -> list[str]:
        """Give back claimed messages that were not delivered: ``(id, reason, action)`` each.

        ``"retry"`` tries again after an exponential backoff until ``max_attempts``, then dead-letters;
        ``"dead"`` dead-letters at once with the reason; ``"release"`` puts the message back at its due time
        without counting an attempt (the promoter is stopping, or the target broker is down). Returns
        ``"retried"``, ``"dead"``, ``"released"`` or ``"not held"`` per message.
        """
        k = self.keys
        outcomes: list[str] = []
        for chunk in _chunks(list(failures)):
            args: list[Any] = [lease_deadline_ms, self.max_attempts, *self.retry_backoff_ms]
            for id, reason, action in chunk:
                if action not in ("retry", "dead", "release"):
                    raise ValueError(f"unknown nack action {action!r}")
                args.extend((id, reason, action))
            reply = self._run(
                "nack",
                [k.inflight, k.due, k.leased, k.dead, k.attempts, k.errors, k.seq, k.stats, k.wake],
                args,
            )
            outcomes.extend(("not held", "retried", "dead", "released")[int(code)] for code in reply)
        return outcomes

    def promote_direct(self, routes: Mapping[str, ListTarget], batch: int, promoter_id: str) -> DirectPromotion:
        """Move due messages straight into Redis lists of this server, exactly once (``promote_list.lua``).

        Messages whose route is not in ``routes`` are dead-lettered: a stored message can only reach the
        queues the application declared.
        """
        if not routes:
            raise ValueError("promote_direct needs at least one route")
        k = self.keys
        keys = [k.due, k.msg, k.dead, k.attempts, k.errors, k.stats, k.promoters]
        args: list[Any] = [_batch(batch), promoter_id]
        for name, target in routes.items():
            keys.extend((target.list_key, target.hash_key or target.list_key))
            args.extend((name, target.mode))
        reply = self._run("promote_list", keys, args)
        next_due = int(reply[1])
        return DirectPromotion(
            now_ms=int(reply[0]),
            next_due_ms=None if next_due < 0 else next_due,
            promoted=int(reply[2]),
            dead_lettered=int(reply[3]),
            lateness_ms=[int(value) for value in reply[4:]],
        )

    def wait_for_wake(self, timeout: float, promoter_id: str) -> bool:
        """Block until a park moves the head earlier, :meth:`wake` is called for this promoter, or timeout.

        Returns True when woken. Uses BLPOP, so a sleeping promoter costs Redis nothing.
        """
        timeout = max(timeout, 0.001)
        kwargs = self.client.get_connection_kwargs()
        # redis-py 8 leaves its default socket timeout (5 s) out of the kwargs of a pool made from a URL (such as
        # a Dramatiq RedisBroker's) and keeps it as orig_socket_timeout: a 5 s BLPOP would then time out.
        socket_timeout = kwargs["socket_timeout"] if "socket_timeout" in kwargs else kwargs.get("orig_socket_timeout")
        if socket_timeout:
            timeout = min(timeout, max(float(socket_timeout) - 1.0, 0.001))
        keys = [self.keys.wake_one(promoter_id), self.keys.wake]
        with self._redis(f"BLPOP on the wake lists {keys}"):
            popped = self.client.blpop(keys, timeout=timeout)
        return popped is not None

    def wake(self, promoter_id: str) -> None:
        """Wake one particular sleeping promoter (used to stop it without waiting out its sleep)."""
        key = self.keys.wake_one(promoter_id)
        with self._redis("waking a promoter"):
            pipe = self.client.pipeline(transaction=True)
            pipe.lpush(key, b"stop")
            pipe.expire(key, 60)
            pipe.execute()

    def forget_promoter(self, promoter_id: str) -> None:
        """Remove a stopped promoter's heartbeat and stop marker."""
        try:
            self.client.zrem(self.keys.promoters, promoter_id)
            self.client.delete(self.keys.wake_one(promoter_id))
        except redis.RedisError:
            pass  # it ages out of the heartbeat window anyway (and a stopping promoter must not raise)

    # -- dead letters ----------------------------------------------------------------------------------

    def requeue_dead(self, ids: Sequence[str] | None = None) -> Requeued:
        """Park dead-lettered messages again, due now, attempts reset. ``ids=None`` requeues all.

        Dead letters with no payload (nothing to requeue) stay; purge them with :meth:`purge_dead`.
        """
        k = self.keys
        keys = [k.dead, k.due, k.msg, k.attempts, k.errors, k.seq, k.wake, k.stats]
        count, left = 0, list[str]()
        if ids is not None:
            for chunk in _chunks([check_id(id) for id in ids]):
                reply = self._run("requeue", keys, [MAX_BATCH, 0, *chunk])
                count += int(reply[0])
                left.extend(id.decode() for id in reply[1:])
            return Requeued(count, left)
        while True:
            # Requeued ids leave the dead set; those it cannot requeue stay at its head: page past them.
            reply = self._run("requeue", keys, [MAX_BATCH, len(left)])
            if reply == [0]:  # an empty page: nothing dead past the ones left
                return Requeued(count, left)
            count += int(reply[0])
            left.extend(id.decode() for id in reply[1:])

    def purge_dead(self, ids: Sequence[str] | None = None) -> int:
        """Delete dead-lettered messages for good. ``ids=None`` purges all."""
        k = self.keys
        keys = [k.dead, k.msg, k.attempts, k.errors]
        if ids is None:
            total = 0
            while deleted := int(self._run("purge", keys, [MAX_BATCH])):
                total += deleted
            return total
        return sum(int(self._run("purge", keys, [MAX_BATCH, *chunk])) for chunk in _chunks(list(ids)))


def _due_argument(delay: Delay | None, due: datetime | None, id: str) -> tuple[str, int]:
    """The scripts' (kind, value) for a due time: ``("d", ms from Redis TIME)`` or ``("a", epoch ms)``."""
    if (delay is None) == (due is None):
        raise InvalidDelay(f"give exactly one of delay and due for {id!r}")
    if delay is not None:
        return "d", delay_to_ms(delay)
    return "a", due_to_ms(due)  # type: ignore[arg-type]


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _int_or_none(value: bytes | str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def check_id(id: object) -> str:
    if not isinstance(id, str):
        raise InvalidMessage(f"message id must be a string, got {type(id).__name__}")
    if not id or len(id) > MAX_ID_LENGTH:
        raise InvalidMessage(f"message id must be 1 to {MAX_ID_LENGTH} characters, got {len(id)}")
    return id


def _batch(batch: int) -> int:
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be 1..{MAX_BATCH}, got {batch}")
    return batch


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(items), MAX_BATCH):
        yield items[start : start + MAX_BATCH]


__all__ = [
    "Claim",
    "ClaimedMessage",
    "DelayStore",
    "DirectPromotion",
    "MessageInfo",
    "ParkRequest",
    "ParkResult",
    "StoreStats",
]
