"""The parts of one store, wired together: each is given only the parts below it (see the package's docstring)."""

from __future__ import annotations

from ..far import FarTier
from .batching import ParkBatcher
from .dead_letters import DeadLetters
from .encoding import Encoder
from .far_view import FarReader, FarView, NoFarTier
from .options import StoreOptions
from .packs import PackOpener
from .parking import RedisParking
from .promotion import Promotion
from .reading import Reading
from .registry import Registry
from .rehoming import Rehoming
from .replication import Replication
from .runner import Runner
from .shards import Shards
from .stats import Stats
from .sweeping import FarSweeper
from .tiers import RedisOnly, WithFarTier


class Parts:
    """What a :class:`~delay_broker.store.DelayStore` is made of, for its options."""

    def __init__(self, shards: Shards, options: StoreOptions) -> None:
        replication = Replication(shards, options.replicas, options.replica_timeout_ms)
        self.runner = runner = Runner(shards, replication)
        self.encoder = Encoder(options.max_payload_bytes, options.record_version)
        self.rehoming = rehoming = Rehoming(shards, runner, options.pack)
        self.parking = parking = RedisParking(shards, runner, rehoming, options.pack, options.max_delay_arg)
        # Concurrent parks share round trips, but for a Cluster (a round trip per node) and durable writes (a
        # WAIT per park): there each park is its own call.
        batched = not shards.cluster and not options.replicas
        self.park_one = ParkBatcher(parking).park if batched else parking.park_one
        self.packs = PackOpener(shards, runner, options.pack)
        self.far_tier = tier = _far_tier(options)
        self.far: FarReader = NoFarTier()
        self.reading = Reading(shards, runner, rehoming, self.packs, self.far)
        self.tier: RedisOnly = RedisOnly(parking, self.reading)
        if tier is not None:
            keys = shards.keys
            view = FarView(tier.table_for(f"{keys.prefix}:{keys.namespace}"), shards)
            self.far = self.reading.far = view
            sweeper = FarSweeper(tier, view, shards, parking, replication)
            self.tier = WithFarTier(parking, self.reading, tier, view, sweeper, options.max_delay_ms)
        self.promotion = Promotion(shards, runner, replication, options.max_attempts, options.retry_backoff_ms)
        self.dead = DeadLetters(shards, runner, rehoming, options.dead_max_count, options.dead_max_age_ms)
        self.registry = Registry(shards, runner, replication)
        self.stats = Stats(shards, runner, self.far)


def _far_tier(options: StoreOptions) -> FarTier | None:
    tier = options.far_tier
    if isinstance(tier, str):
        return FarTier(tier) if options.far_horizon is None else FarTier.with_horizon(tier, options.far_horizon)
    return tier
