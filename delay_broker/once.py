"""Effectively-once execution of promoted messages (opt-in): a second delivery of one promotion is dropped.

Promotion into a broker other than the store's Redis (RabbitMQ, SQS, another Redis) is at least once: a promoter
killed between its publish and its acknowledgement leaves its lease to run out, and another promoter publishes
the batch again. The copies are the same message (same id, same payload). The adapters' worker hooks ask
:class:`Executions` before a worker runs a message the store promoted and tell it how the run ended:

- the deliverers mark each promoted message with its **promotion token** (:func:`promotion_token`: the time the
  store's record was written, the same for every delivery of one park and different for every new park of the
  id, e.g. a retry parked again);
- before the body runs, ``SET <record> r NX PX <window>`` on the message's shard, the record named by the
  message id, the promotion token and the framework's retry count (a framework retry is a new execution);
- after a body that returned, ``SET <record> d PX <window>``; after one that raised, the record is deleted, so
  a later delivery of a failed execution runs again (the framework's own retry has a new retry count anyway);
- a delivery that finds ``d`` is dropped: acknowledged, not run, counted in the store's ``duplicates_dropped``
  counter. One that finds ``r`` runs: an earlier delivery began and has not ended, either because its worker
  died mid-run (the broker redelivers that copy: dropping it would lose the message) or because it is still
  running (two copies at the same moment: then both run, as without the record).

Unmarked messages (everything an application sends itself, and what the exactly-once path promotes) cost one
dictionary look-up. A store that stops answering is asked again for :data:`PATIENCE_S` (a Sentinel failover is
over by then); when it still cannot be reached the message runs unchecked: at least once is the fallback. With
the store's ``replicas`` set, the ``d`` record is confirmed by the replicas like every write of the store, so a
failover does not lose it with the old master's last writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.exceptions import RedisClusterException

from .envelope import Envelope
from .errors import ConfigurationError, DelayBrokerError
from .redis_errors import translate
from .store import MAX_ID_LENGTH, DelayStore

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

logger = logging.getLogger("delay_broker.once")

PROMOTION_MARK = "delay_broker_promotion"
"""Where a promoted message carries its promotion token: a Dramatiq message option, a Celery message header."""

DEFAULT_WINDOW = 3600.0
"""Seconds a record is kept at least: how long after a delivery a second delivery of it is still recognised.

The adapters' default is :func:`default_window`: this, or longer where the broker redelivers later. An hour covers a
promoter's lease (30 s by default) many times over, RabbitMQ (which redelivers a dead consumer's messages at once)
and kombu's SQS visibility timeout (1800 s). A copy that arrives later runs (at least once)."""

WINDOW_MARGIN_S = 60.0
"""What :func:`default_window` adds to the longest wait it covers."""

DROPPED_COUNTER = "duplicates_dropped"
"""The store counter (``stats()["counters"]``) of deliveries dropped as duplicates, over every worker."""

RETRY_AFTER_S = 1.0
"""After the store failed to answer, messages run unchecked for this long before it is asked again: a store that
is down costs each message one failed call at most once a second, not a timeout each."""

PATIENCE_S = 5.0
"""How long a worker asks again a store that answered until now before it runs a message unchecked, or leaves its
record unconfirmed: a Sentinel failover (the old master read-only, the new one not yet named) or a replica's
confirmation. A store already known to be down is asked once."""

IMPATIENT_S = 60.0
"""Once patience ran out (a store down for longer, a replica that stays away), calls are made once for this long:
a worker stalls :data:`PATIENCE_S` at most once a minute, not on every message."""

_PAUSE_S = 0.1
"""Between two of those asks."""

_LOGGED = 10_000
"""Ids whose drop a process remembers having logged: each is logged once (INFO), not once per copy."""

_RUNNING, _DONE = b"r", b"d"

_STORE_ERRORS = (redis.RedisError, RedisClusterException, DelayBrokerError)
_T = TypeVar("_T")


class Verdict(Enum):
    RUN = "run"
    """The first delivery of this execution: recorded, run it."""
    RERUN = "rerun"
    """An earlier delivery began and has not ended (its worker died, or it is running now): run it."""
    DUPLICATE = "duplicate"
    """An earlier delivery ran to its end: drop this one (acknowledge it, do not run it)."""
    UNCHECKED = "unchecked"
    """The store could not be asked: run it (at least once)."""


@dataclass(frozen=True)
class Execution:
    """What :meth:`Executions.begin` decided for one delivery; give it back to :meth:`Executions.end`."""

    verdict: Verdict
    id: str
    key: str = ""
    shard: int = 0

    @property
    def runs(self) -> bool:
        return self.verdict is not Verdict.DUPLICATE


def promotion_token(envelope: Envelope) -> str | None:
    """The token a deliverer marks a promoted message with: the envelope's parked-at time in ms, which every
    delivery of one park shares. None for a record without one (written before it was kept): left unmarked."""
    return str(envelope.parked_at_ms) if envelope.parked_at_ms > 0 else None


def parse_token(value: object) -> str | None:
    """A promotion token read from a message, or None when it is absent or not one (the message runs unchecked)."""
    if isinstance(value, str) and 0 < len(value) <= 16 and value.isdigit():
        return value
    return None


def check_window(window: object) -> float:
    """The ``window`` option: positive, finite seconds."""
    if isinstance(window, bool) or not isinstance(window, int | float) or not 0 < window < float("inf"):
        raise ConfigurationError(f"the effectively-once window must be positive seconds, got {window!r}")
    return float(window)


def default_window(lease: float, redelivery: float | None = None) -> float:
    """The window that covers a promoter killed between its publish and its acknowledgement (its batch comes
    again after ``lease``) and a worker killed after a body ran but before the broker heard of it (the broker
    hands the message out again after ``redelivery``: an SQS or Redis visibility timeout; RabbitMQ at once):
    :data:`DEFAULT_WINDOW`, or both waits and :data:`WINDOW_MARGIN_S` when that is longer."""
    return max(DEFAULT_WINDOW, lease + (redelivery or 0.0) + WINDOW_MARGIN_S)


def window_too_short(window: float, lease: float, redelivery: float | None = None) -> str | None:
    """Why ``window`` cannot cover the documented cases, or None. ``lease``: the promoters' (a killed promoter's
    batch is published again once it has run out); ``redelivery``: how long the broker waits before it hands
    out again a message whose worker died (SQS's visibility timeout; RabbitMQ does at once)."""
    if window <= lease:
        return (
            f"the effectively-once window of {window:g} s is not longer than the promoters' lease of {lease:g} s: "
            "a batch published again after a promoter died may come after the first delivery's record expired"
        )
    if redelivery is not None and window <= redelivery:
        return (
            f"the effectively-once window of {window:g} s is not longer than the broker's visibility timeout of "
            f"{redelivery:g} s: a message whose worker died after running it comes back after its record expired "
            "and runs again. Raise the window, or lower the visibility timeout"
        )
    return None


class Executions:
    """The executions of promoted messages, recorded in a store's Redis.

    Parameters:
      store: whose Redis holds the records (on each message's shard) and whose counters count the drops.
      window: seconds a record is kept (see :data:`DEFAULT_WINDOW`): longer than the longest time between two
        deliveries of one message (the promoters' ``lease``; the broker's visibility timeout).
      metrics: count the drops of this process in ``delay_broker_duplicates_dropped_total`` too (Prometheus).
      registry: the ``prometheus_client`` registry of that counter (default: the global one).
    """

    def __init__(
        self,
        store: DelayStore,
        window: float = DEFAULT_WINDOW,
        *,
        metrics: bool = False,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.window = check_window(window)
        self._window_ms = max(1, round(self.window * 1000))
        self._down_until = 0.0
        self._impatient_until = float("-inf")
        """Until then a store call is made once: patience ran out on one (:data:`IMPATIENT_S`)."""
        self._warned_at = float("-inf")
        self._logged: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._dropped = _dropped_counter(store.keys.namespace, registry) if metrics else None

    def begin(self, id: str, token: object, attempt: int = 0) -> Execution:
        """Record that a delivery of ``id`` (promotion ``token``, the framework's retry count ``attempt``) starts.

        Run the message unless the verdict is :attr:`Verdict.DUPLICATE`. A message without a valid token is
        :attr:`Verdict.UNCHECKED` (nothing is asked)."""
        promotion = parse_token(token)
        if promotion is None or not isinstance(id, str) or not 0 < len(id) <= MAX_ID_LENGTH or attempt < 0:
            return Execution(Verdict.UNCHECKED, str(id))
        if time.monotonic() < self._down_until:
            return Execution(Verdict.UNCHECKED, id)
        try:
            shard = self.store.shard_for(id)  # the layout is read from Redis on first use
            space = self.store.shards[shard]
            key = space.once(id, promotion, attempt)
            claimed = self._patiently(self._claim, key)
        except _STORE_ERRORS as error:
            self._unreachable(id, error)
            return Execution(Verdict.UNCHECKED, id)
        if claimed is not False:
            return Execution(Verdict.RUN if claimed else Verdict.RERUN, id, key, shard)
        self._count_drop(id, space.stats)
        self._log_drop(id, promotion, attempt)
        return Execution(Verdict.DUPLICATE, id, key, shard)

    def end(self, execution: Execution, *, succeeded: bool) -> None:
        """The body of a delivery :meth:`begin` let run has returned (``succeeded``) or raised.

        A return records the execution as done, so later copies are dropped; a raise deletes the record, so a
        later delivery of it runs (a failed execution is the framework's to retry)."""
        if execution.verdict not in (Verdict.RUN, Verdict.RERUN):
            return
        try:
            if succeeded and self.store.replicas:
                # Confirmed by the replicas: the record a failover would lose is the one that drops copies.
                self._patiently(self.store.set_record, execution.key, _DONE, self._window_ms, execution.shard)
            elif succeeded:
                self._patiently(self.store.client.set, execution.key, _DONE, px=self._window_ms)
            else:
                self._patiently(self.store.client.delete, execution.key)
        except _STORE_ERRORS as error:
            # The record stays "r" (or, deleted, stays): a later copy runs, as at least once does.
            self._unreachable(execution.id, error)

    def _claim(self, key: str) -> bool | None:
        """True: recorded now; False: an earlier delivery ended (``d``); None: one began and has not."""
        if self.store.client.set(key, _RUNNING, nx=True, px=self._window_ms):
            return True
        return False if self.store.client.get(key) == _DONE else None

    def _patiently(self, call: Callable[..., _T], *args: Any, **options: Any) -> _T:
        """``call(*args, **options)``, made again for :data:`PATIENCE_S` while the store refuses it, unless patience
        ran out lately."""
        deadline = None
        while True:
            try:
                return call(*args, **options)
            except _STORE_ERRORS:
                now = time.monotonic()
                if deadline is None:  # the first failure: the happy path reads no clock
                    deadline = now if now < self._impatient_until else now + PATIENCE_S
                if now + _PAUSE_S > deadline:
                    self._impatient_until = max(self._impatient_until, now + IMPATIENT_S)
                    raise
                time.sleep(_PAUSE_S)

    def _count_drop(self, id: str, stats_key: str) -> None:
        if self._dropped is not None:
            self._dropped.inc()
        try:
            self.store.client.hincrby(stats_key, DROPPED_COUNTER, 1)
        except (redis.RedisError, RedisClusterException) as error:
            self._unreachable(id, error)  # dropped all the same: it is known to have run

    def _log_drop(self, id: str, promotion: str, attempt: int) -> None:
        with self._lock:
            if id in self._logged:
                self._logged.move_to_end(id)
                return
            self._logged[id] = None
            if len(self._logged) > _LOGGED:
                self._logged.popitem(last=False)
        logger.info(
            "Dropped a second delivery of message %s (promotion %s, retry %d): an earlier delivery of it ran to its "
            "end within the last %g s. Acknowledged without running it.",
            id,
            promotion,
            attempt,
            self.window,
        )

    def _unreachable(self, id: str, error: BaseException) -> None:
        now = time.monotonic()
        self._down_until = now + RETRY_AFTER_S
        if isinstance(error, redis.RedisError | RedisClusterException):
            error = translate(error, "recording an execution")
        with self._lock:
            warn, self._warned_at = now - self._warned_at >= 60.0, now
        if warn:
            logger.warning(
                "The delay store could not record the execution of message %s (%s): promoted messages run unchecked "
                "(at least once) until it answers again.",
                id,
                error,
            )


_counters: dict[int, Any] = {}
_counters_lock = threading.Lock()


def _dropped_counter(namespace: str, registry: CollectorRegistry | None = None) -> Any:
    """This process's ``delay_broker_duplicates_dropped_total`` for ``namespace`` (one family per registry)."""
    from .metrics import PREFIX, default_registry, prometheus

    registry = registry or default_registry()
    with _counters_lock:
        family = _counters.get(id(registry))
        if family is None:
            family = _counters[id(registry)] = prometheus().Counter(
                f"{PREFIX}_duplicates_dropped",
                "Deliveries of promoted messages this process dropped as duplicates (effectively-once execution).",
                ["namespace"],
                registry=registry,
            )
    return family.labels(namespace=namespace)
