"""Reliable fetch for kombu's Redis channels: a task leaves its queue in the same step that records it as
unacknowledged.

kombu takes a task with ``BRPOP`` and records it in its ``unacked`` hash (what ``visibility_timeout`` restores
from) only once it has parsed the reply and built the message. A worker killed in between loses the task,
``acks_late`` or not. On a busy worker a SIGKILL often lands there: the chaos run lost a task in about one kill of
a Celery worker in three.

Here the blocking command only waits: ``BLMOVE key key LEFT LEFT`` returns when the first queue list has a task and
leaves the list as it was. Then ``fetch.lua`` pops as many tasks as the worker has room for (its prefetch credit,
at most :data:`FETCH_BATCH`) and records each, atomically; kombu reads the wait's reply only when there is room.

Against kombu's fetch: two round trips per batch instead of two per task (kombu's own record write is skipped);
every worker blocked on an idle queue wakes for a new task and one of them gets it; a task on another list than
the one waited on (another queue, a priority) waits for the next wake, at most ``brpop_timeout`` (1 s). After a
full fetch there is no wait: the next fetch itself is what the poller waits on, so a backlog (on any of the
lists) drains batch after batch in one round trip each. Turned off by the ``reliable_fetch`` option.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import resources
from queue import Empty
from time import monotonic, time
from typing import Any

import redis
from kombu.transport import virtual
from kombu.transport.redis import QoS as RedisQoS
from kombu.utils import json as kombu_json

FETCH_SOURCE = resources.files(__package__).joinpath("fetch.lua").read_text(encoding="utf-8")
FETCH_SHA = hashlib.sha1(FETCH_SOURCE.encode()).hexdigest()

FETCH_BATCH = 4
"""Most tasks one fetch takes. A fetch hands its tasks to the worker in one stretch of Python, holding the GIL: at 32
(the prefetch of 8 threads) a promoter thread in the same busy worker promoted 190-280 ms late at p99 instead of
5 ms, for 1.6x kombu's fetch rate instead of 1.4x (``python -m benchmarks --only lateness``; ``fetch_rates``)."""

_kombu_loads: Callable[[str], Any] = kombu_json.loads
_redis_execute: Callable[..., Any] = redis.Redis.execute_command
"""redis-py's own: kombu's prefixing client (``global_keyprefix``) would prefix the first key of a script only."""


class RecordedAtFetchQoS(RedisQoS):
    """kombu's Redis QoS, which does not write the unacked record again for a task ``fetch.lua`` recorded."""

    def append(self, message: Any, delivery_tag: str) -> None:
        recorded: set[str] = self.channel.recorded_at_fetch
        if delivery_tag in recorded:
            recorded.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]  # bookkeeping only
        else:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]


class ReliableFetch:
    """Mixin of our Redis channels (plain and Sentinel); see the module docstring."""

    QoS = RecordedAtFetchQoS

    # kombu's Channel attributes this mixin uses.
    client: Any
    connection: Any
    connection_errors: Any
    global_keyprefix: str
    active_queues: Any
    priority_steps: list[int]
    unacked_index_key: str
    unacked_key: str
    _queue_cycle: Any
    _in_poll: Any
    _brpop_sent_at: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.recorded_at_fetch: set[str] = set()
        self._no_ack_queues: set[str] = set()
        self._fetching_from: list[tuple[str, str]] = []
        self._more_waiting = False
        self._waiting_with = "BLMOVE"
        self._sent_fetch: tuple[list[Any], int] = ([], 0)
        super().__init__(*args, **kwargs)

    @property
    def fetches_reliably(self) -> bool:
        options = getattr(self.connection, "delay_broker_options", None)
        return bool(options is not None and options.reliable_fetch)

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        else:
            self._no_ack_queues.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)  # type: ignore[misc]

    def _brpop_start(self, timeout: float | None = None) -> None:
        if not self.fetches_reliably:
            return super()._brpop_start(timeout)  # type: ignore[misc, no-any-return]
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return None
        # Keys as the server knows them: these commands bypass the client's global_keyprefix (see _redis_execute).
        self._fetching_from = [
            ((self.global_keyprefix or "") + self._q_for_pri(queue, priority), queue)  # type: ignore[attr-defined]
            for priority in self.priority_steps
            for queue in queues
        ]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()  # kombu >= 5.7 checks the waiting connection's health with it
        if self._more_waiting:
            # The last fetch was full: more may wait, on any of the lists. The fetch itself is the command the
            # poller waits on: no wait command and its reply (a whole task) before it.
            self._waiting_with = "EVALSHA"
            self._sent_fetch = self._fetch_arguments()
            self.client.connection.send_command("EVALSHA", FETCH_SHA, *self._sent_fetch[0])
            return None
        self._waiting_with = "BLMOVE"
        first = self._fetching_from[0][0]
        wait = getattr(self, "brpop_timeout", 1) if timeout is None else timeout  # kombu < 5.7 has no option
        self.client.connection.send_command("BLMOVE", first, first, "LEFT", "LEFT", wait or 0)
        return None

    def _brpop_read(self, **options: Any) -> bool:
        if not self.fetches_reliably:
            return super()._brpop_read(**options)  # type: ignore[misc, no-any-return]
        try:
            try:
                fetched, limit = self._fetched(**options)
                self._more_waiting = len(fetched) >= 3 * limit
            except self.connection_errors:
                self.client.connection.disconnect()  # the next poll reconnects, as kombu's own read does
                raise
            if not fetched:
                raise Empty()
            queues = dict(self._fetching_from)
            for at in range(0, len(fetched), 3):
                key, raw, recorded = fetched[at : at + 3]
                queue = queues[_text(key)]
                message = _kombu_loads(_text(raw))  # kombu's JSON, as its own fetch decodes
                if recorded:
                    self.recorded_at_fetch.add(message["properties"]["delivery_tag"])
                self.connection._deliver(message, queue)
            self._queue_cycle.rotate(queue)
            return True
        finally:
            self._in_poll = None
            flush_reauth = getattr(self, "_flush_brpop_reauth", None)  # kombu >= 5.7
            if flush_reauth is not None:
                flush_reauth()

    def _fetched(self, **options: Any) -> tuple[list[Any], int]:
        """Reads the reply of what :meth:`_brpop_start` sent; returns the tasks ``fetch.lua`` took, as it
        returned them, and the most it was to take."""
        if self._waiting_with == "EVALSHA":
            arguments, limit = self._sent_fetch
            try:
                return self.client.parse_response(self.client.connection, "EVALSHA", **options), limit
            except redis.exceptions.NoScriptError:  # a restarted or failed-over server: nothing was taken
                return _redis_execute(self.client, "EVAL", FETCH_SOURCE, *arguments), limit
        # The wait returned: a task is there. The connection is idle again, the fetch goes on it.
        self.client.parse_response(self.client.connection, self._waiting_with, **options)
        arguments, limit = self._fetch_arguments()
        try:
            return _redis_execute(self.client, "EVALSHA", FETCH_SHA, *arguments), limit
        except redis.exceptions.NoScriptError:
            return _redis_execute(self.client, "EVAL", FETCH_SOURCE, *arguments), limit

    def _fetch_arguments(self) -> tuple[list[Any], int]:
        """``fetch.lua``'s arguments after the script (the key count, keys and ARGV) for the lists being consumed,
        and the most tasks it is to take (the worker's room, at most :data:`FETCH_BATCH`)."""
        prefix = self.global_keyprefix or ""
        keys = [prefix + self.unacked_index_key, prefix + self.unacked_key, *(key for key, _ in self._fetching_from)]
        flags = ["0" if queue in self._no_ack_queues else "1" for _, queue in self._fetching_from]
        room = self.qos.can_consume_max_estimate()  # type: ignore[attr-defined]
        limit = FETCH_BATCH if room is None else max(1, min(int(room), FETCH_BATCH))
        return [len(keys), *keys, repr(time()), limit, *flags], limit


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode()
