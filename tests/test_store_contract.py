# ruff: noqa: E501 (signatures are pinned as inspect prints them)
"""The store's public contract, pinned before its redesign: names importable from ``delay_broker.store``,
``DelayStore``'s public members with their signatures, and the public attributes of a store."""

from __future__ import annotations

import inspect

import delay_broker.store
from delay_broker.store import DelayStore

IMPORTABLE = (
    "CLIENT_DEFAULTS",
    "Claim",
    "ClaimedMessage",
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_PACK_AFTER_MS",
    "DelayStore",
    "DirectPromotion",
    "FAR_HOLD_BACK_SECONDS",
    "LATENESS_EDGES_MS",
    "ListState",
    "MAX_BATCH",
    "MAX_ID_LENGTH",
    "MessageInfo",
    "NEW_INDEX",
    "NackAction",
    "OnConflict",
    "PACK_CALLS",
    "PACK_OPEN_CHUNK",
    "ParkRequest",
    "ParkResult",
    "ReshardRefused",
    "ReshardReport",
    "STORE_OPTIONS",
    "State",
    "StoreStats",
    "check_id",
    "logger",
    "new_promoter_id",
)

MEMBERS = {
    "HISTOGRAM_EDGES": "constant",
    "from_url": "(cls, url: 'str', **options: 'Any') -> 'DelayStore'",
    "shards": "property",
    "refresh_layout": "(self) -> 'None'",
    "reshard": "(self, to: 'int', *, dry_run: 'bool' = False, **options: 'Any') -> 'ReshardReport'",
    "shard_for": "(self, id: 'str') -> 'int'",
    "park": "(self, id: 'str', envelope: 'Envelope', *, delay: 'Delay | None' = None, due: 'datetime | None' = None, on_conflict: 'OnConflict' = 'replace') -> 'ParkResult'",
    "park_many": "(self, requests: 'Iterable[ParkRequest]', *, on_conflict: 'OnConflict' = 'replace') -> 'list[ParkResult]'",
    "park_occurrence": "(self, schedule: 'str', id: 'str', envelope: 'Envelope', due: 'datetime', *, revision: 'int | None' = None) -> 'ParkResult'",
    "withdraw": "(self, id: 'str', payload: 'bytes') -> 'bool'",
    "cancel": "(self, id: 'str') -> 'bool'",
    "cancel_many": "(self, ids: 'Sequence[str]') -> 'int'",
    "cancel_each": "(self, ids: 'Sequence[str]') -> 'list[bool]'",
    "reschedule": "(self, id: 'str', *, delay: 'Delay | None' = None, due: 'datetime | None' = None, envelope: 'Envelope | None' = None, expected: 'MessageInfo | None' = None) -> 'int | None'",
    "now_ms": "(self) -> 'int'",
    "record_routes": "(self, routes: 'Iterable[str]') -> 'None'",
    "recorded_routes": "(self) -> 'set[str]'",
    "schedules": "(self) -> 'dict[str, int | None]'",
    "forget_schedule": "(self, name: 'str') -> 'bool'",
    "stored_schedules": "(self) -> 'StoredSchedules'",
    "schedules_revision": "(self) -> 'int'",
    "update_schedule": "(self, name: 'str', definition: 'bytes | None', *, revision: 'int | None', record: 'int | None', record_action: \"Literal['keep', 'rewind', 'drop']\" = 'keep', cancel: 'str | None' = None, drop_also: 'str | None' = None, marker: 'str | None' = None) -> 'ScheduleUpdate'",
    "estimated_now_ms": "(self) -> 'int'",
    "sweep_far": "(self, *, ids: 'Sequence[str]' = ()) -> 'int'",
    "forget_moved_orphans": "(self, older_than: 'float' = 300.0) -> 'int'",
    "far_snapshot": "(self) -> 'Iterator[FarSnapshot | None]'",
    "get": "(self, id: 'str') -> 'MessageInfo | None'",
    "list_messages": "(self, state: 'ListState' = 'due', *, start_ms: 'int | None' = None, end_ms: 'int | None' = None, offset: 'int' = 0, count: 'int' = 100, headers_only: 'bool' = False) -> 'list[MessageInfo]'",
    "scan_index": "(self, state: 'ListState', shard: 'int', *, min_score: 'str', max_score: 'str', after: 'Position | None', scan: 'int', limit: 'int', queue: 'str | None' = None, task: 'str | None' = None, id_prefix: 'str | None' = None, headers_only: 'bool' = False) -> 'IndexScan'",
    "scan_packs": "(self, shard: 'int', *, start_ms: 'int | None', end_ms: 'int | None', after: 'Position | None', scan: 'int', limit: 'int', queue: 'str | None' = None, task: 'str | None' = None, id_prefix: 'str | None' = None, headers_only: 'bool' = False) -> 'IndexScan'",
    "scan_far": "(self, *, start_ms: 'int | None', end_ms: 'int | None', after: 'Position | None', scan: 'int', queue: 'str | None' = None, task: 'str | None' = None, id_prefix: 'str | None' = None, snapshot: 'FarSnapshot | None' = None) -> 'IndexScan'",
    "promotion_lateness": "(self) -> 'list[tuple[str, int]]'",
    "iter_all": "(self, state: 'ListState' = 'due', page: 'int' = 500) -> 'Iterator[MessageInfo]'",
    "stats": "(self, heartbeat_window: 'float' = 30.0) -> 'StoreStats'",
    "claim": "(self, batch: 'int', lease: 'float', promoter_id: 'str', *, shard: 'int' = 0, ahead: 'float' = 0.0) -> 'Claim'",
    "ack": "(self, lease_deadline_ms: 'int', ids: 'Sequence[str]', *, shard: 'int' = 0) -> 'int'",
    "renew": "(self, lease_deadline_ms: 'int', ids: 'Sequence[str]', lease: 'float', *, shard: 'int' = 0) -> 'tuple[int, int]'",
    "nack": "(self, lease_deadline_ms: 'int', failures: 'Sequence[tuple[str, str, NackAction]]', *, shard: 'int' = 0) -> 'list[str]'",
    "check_direct": "(self, routes: 'Mapping[str, ListTarget]') -> 'None'",
    "pack_lead_ms": "property",
    "open_packs": "(self, shard: 'int', *, calls: 'int' = 8) -> 'int | None'",
    # lateness and ahead (here and in claim): keywords added after the redesign (their defaults keep what every caller had).
    "promote_direct": "(self, routes: 'Mapping[str, ListTarget]', batch: 'int', promoter_id: 'str', *, shard: 'int' = 0, lateness: 'bool' = True, ahead: 'float' = 0.0) -> 'DirectPromotion'",
    "wait_for_wake": "(self, timeout: 'float', promoter_id: 'str') -> 'frozenset[int] | None'",
    "wake": "(self, promoter_id: 'str') -> 'None'",
    "eviction_policies": "(self) -> 'dict[str, str]'",
    "forget_promoter": "(self, promoter_id: 'str') -> 'None'",
    # Added after the redesign: effectively-once execution's records, durable with the store's replicas.
    "set_record": "(self, key: 'str', value: 'bytes', ttl_ms: 'int', shard: 'int') -> 'None'",
    "requeue_dead": "(self, ids: 'Sequence[str] | None' = None, *, dead_by_ms: 'int | None' = None) -> 'Requeued'",
    "trims_dead": "property",
    "trim_dead": "(self, shard: 'int | None' = None) -> 'int'",
    "purge_dead": "(self, ids: 'Sequence[str] | None' = None, *, dead_by_ms: 'int | None' = None) -> 'int'",
}

INIT = "(self, client: 'AnyRedis', *, namespace: 'str' = 'default', prefix: 'str' = 'delay_broker', max_payload_bytes: 'int' = 1048576, max_attempts: 'int' = 5, retry_backoff: 'tuple[float, float]' = (1.0, 300.0), shards: 'int | None' = None, replicas: 'int' = 0, replica_timeout: 'float' = 1.0, max_delay: 'Delay | None' = None, dead_max_count: 'int | None' = None, dead_max_age: 'Delay | None' = None, record_version: 'int' = 2, far_tier: 'FarTier | str | None' = None, far_horizon: 'Delay | None' = None, pack_after: 'Delay | None' = 300.0) -> 'None'"

ATTRIBUTES = (
    "client",
    "cluster",
    "dead_max_age_ms",
    "dead_max_count",
    "far_tier",
    "keys",
    "max_attempts",
    "max_delay_ms",
    "max_payload_bytes",
    "pack_after_ms",
    "record_version",
    "replica_timeout_ms",
    "replicas",
    "retry_backoff_ms",
)


def test_every_name_importable_before_still_is() -> None:
    missing = [name for name in IMPORTABLE if not hasattr(delay_broker.store, name)]
    assert not missing


def test_the_store_keeps_its_members_and_their_signatures() -> None:
    found = {}
    for name in MEMBERS:
        value = inspect.getattr_static(DelayStore, name, None)
        if isinstance(value, property):
            found[name] = "property"
        elif isinstance(value, classmethod | staticmethod):
            found[name] = str(inspect.signature(value.__func__))
        elif callable(value):
            found[name] = str(inspect.signature(value))
        else:
            found[name] = "constant" if value is not None else "missing"
    assert found == MEMBERS
    assert str(inspect.signature(DelayStore.__init__)) == INIT


def test_a_store_keeps_its_public_attributes(store: DelayStore) -> None:
    missing = [name for name in ATTRIBUTES if not hasattr(store, name)]
    assert not missing
    assert store.pack_after_ms == 300_000 and store.retry_backoff_ms == (50, 200) and store.max_attempts == 3
