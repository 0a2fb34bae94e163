"""A promoter in a process of its own, for the multi-process and kill -9 tests.

    python -m tests.promoter_process REDIS_URL NAMESPACE TARGET_LIST [--lease-mode] [--deliver-sleep S]

``--lease-mode`` delivers at-least-once through a separate RPUSH per message (claim, push, ack), so a kill
between push and ack shows what the lease recovers; without it the exactly-once script is used.

``REDIS_URL`` may also be a ``redis+cluster://`` or ``redis+sentinel://`` URL (the HA chaos tests); the store
then reads the namespace's shard count, and the target list is pushed through the same client.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import time

import redis

from delay_broker import ClaimedMessage, DelayStore, ListTarget, Promoter
from delay_broker.connect import CLUSTER_SCHEMES, SENTINEL_SCHEMES, AnyRedis, client_from_url
from delay_broker.deliverers import DirectLists, ListDeliverer
from delay_broker.far import FarTier


class SlowListDeliverer(ListDeliverer):
    """Sleeps before each push so that a kill lands in the middle of a batch."""

    def __init__(self, client: AnyRedis, target: ListTarget, pause: float) -> None:
        super().__init__(client, {"ready": target})
        self.pause = pause

    def deliver(self, message: ClaimedMessage) -> None:
        if self.pause:
            time.sleep(self.pause)
        super().deliver(message)


def make_client(url: str) -> AnyRedis:
    # Plain URLs keep redis-py's own client (and its defaults), as the single-server tests always had; only our
    # multi-host forms need delay_broker.connect.
    if url.split("://", 1)[0].lower() in (*CLUSTER_SCHEMES, *SENTINEL_SCHEMES):
        return client_from_url(url)
    return redis.Redis.from_url(url)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("target")
    parser.add_argument("--lease-mode", action="store_true")
    parser.add_argument("--deliver-sleep", type=float, default=0.0)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--max-idle", type=float, default=0.5)
    parser.add_argument("--far-url", help="PostgreSQL URL of the store's far tier: this promoter also sweeps it")
    parser.add_argument("--far-horizon", type=float, default=2.0)
    parser.add_argument("--far-sweep", type=float, default=0.1)
    parser.add_argument("--far-batch", type=int, default=100)
    options = parser.parse_args()

    client = make_client(options.url)
    far = None
    if options.far_url:
        far = FarTier(
            options.far_url,
            horizon=options.far_horizon,
            sweep_interval=options.far_sweep,
            batch=options.far_batch,
            lease=5.0,
        )
    store = DelayStore(client, namespace=options.namespace, far_tier=far)
    target = ListTarget(options.target, mode="rpush")
    deliverer = (
        SlowListDeliverer(client, target, options.deliver_sleep)
        if options.lease_mode
        else DirectLists({"ready": target})
    )
    promoter = Promoter(store, deliverer, batch=options.batch, lease=options.lease, max_idle=options.max_idle)
    signal.signal(signal.SIGTERM, lambda *_: promoter.request_stop())
    faulthandler.register(signal.SIGUSR1)  # a test that times out waiting for this process shows where it hung
    print("ready", flush=True)
    promoter.run()


if __name__ == "__main__":
    main()
