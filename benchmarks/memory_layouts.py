"""What each candidate Redis layout costs per parked message, measured, not estimated.

    python benchmarks/memory_layouts.py [--messages N] [--redis-server PATH]

Starts a private redis-server and fills it, one layout at a time, with N Dramatiq-shaped messages (36-character
uuid ids, a 47-byte binary envelope header, 250-byte payloads), printing Redis ``used_memory`` per message and,
for layouts that hold the payload, per message beyond it. docs/architecture.md uses these figures to say what a
store must change to reach a given number of bytes per message; the store itself is measured by
``python -m benchmarks --only memory``.
"""

from __future__ import annotations

import argparse
import sys
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from delay_broker.embedded import EmbeddedRedis

PAYLOAD = b"p" * 250
HEADER = b"h" * 47
DUE = b"\x00\x00\x01\x8b\xcf\xe5\x68\x00"  # 8 bytes, as a packed record would hold its due time
INDEX_BUCKETS = 1 << 14
"""Small hashes of the id index: about 61 ids each at 1M, under the 128 entries that keep a hash listpack-encoded."""


def ids(count: int, binary: bool = False) -> Iterator[bytes]:
    for _ in range(count):
        value = uuid.uuid4()
        yield value.bytes if binary else str(value).encode()


def chunks(items: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


Fill = Callable[[redis.Redis, str, int], list[str]]
"""Writes ``count`` messages under a key prefix; returns the keys it made (to delete them afterwards)."""


def hash_of_envelopes(binary: bool) -> Fill:
    def fill(client: redis.Redis, prefix: str, count: int) -> list[str]:
        for chunk in chunks(ids(count, binary), 2000):
            client.hset(f"{prefix}:msg", mapping=dict.fromkeys(chunk, HEADER + PAYLOAD))
        return [f"{prefix}:msg"]

    return fill


def skiplist_index(client: redis.Redis, prefix: str, count: int) -> list[str]:
    for chunk in chunks(ids(count), 2000):
        client.zadd(f"{prefix}:due", dict.fromkeys(chunk, 1.7e15))
    return [f"{prefix}:due"]


def packed_lists(binary: bool) -> Fill:
    def fill(client: redis.Redis, prefix: str, count: int) -> list[str]:
        keys = []
        for n, chunk in enumerate(chunks(ids(count, binary), 1000)):
            keys.append(f"{prefix}:bucket:{n}")
            client.rpush(keys[-1], *[id + DUE + HEADER + PAYLOAD for id in chunk])
        return keys

    return fill


def listpack_id_index(binary: bool) -> Fill:
    def fill(client: redis.Redis, prefix: str, count: int) -> list[str]:
        keys: set[str] = set()
        for chunk in chunks(ids(count, binary), 2000):
            pipe = client.pipeline(transaction=False)
            for id in chunk:
                key = f"{prefix}:ids:{zlib.crc32(id) % INDEX_BUCKETS}"
                keys.add(key)
                pipe.hset(key, id, 123456)
            pipe.execute()
        return sorted(keys)

    return fill


def listpack_time_index(client: redis.Redis, prefix: str, count: int) -> list[str]:
    keys = []
    for n, chunk in enumerate(chunks(ids(count), 100)):
        keys.append(f"{prefix}:slot:{n}")
        client.zadd(keys[-1], {id: 1.7e15 + k for k, id in enumerate(chunk)})
    return keys


LAYOUTS: list[tuple[str, Fill, bool]] = [
    ("HASH id (36 chars) -> header + payload (the store's msg)", hash_of_envelopes(False), True),
    ("HASH id (16 bytes) -> header + payload", hash_of_envelopes(True), True),
    ("ZSET id (36 chars), skiplist (the store's due)", skiplist_index, False),
    ("LISTs of 1,000 records: id (36) + due + header + payload", packed_lists(False), True),
    ("LISTs of 1,000 records: id (16 bytes) + due + header + payload", packed_lists(True), True),
    ("id index: 16,384 listpack HASHes, id (36) -> int", listpack_id_index(False), False),
    ("id index: 16,384 listpack HASHes, id (16 bytes) -> int", listpack_id_index(True), False),
    ("time index: listpack ZSETs of 100 ids (36)", listpack_time_index, False),
]


def measure(client: redis.Redis, fill: Fill, count: int) -> float:
    before = int(client.info("memory")["used_memory"])
    keys = fill(client, f"layout-{uuid.uuid4().hex[:6]}", count)
    after = int(client.info("memory")["used_memory"])
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])
    return (after - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--redis-server", help="the redis-server binary to measure on (default: the one on the PATH)")
    options = parser.parse_args()
    count = options.messages
    with EmbeddedRedis(["--appendonly", "no", "--maxmemory", "0"], executable=options.redis_server) as server:
        client = server.client()
        print(f"redis-server {client.info('server')['redis_version']}, {count:,} messages per layout")
        print(f"{'layout':64} {'B/message':>10} {'beyond payload':>15}")
        for name, fill, holds_payload in LAYOUTS:
            per_message = measure(client, fill, count)
            beyond = f"{per_message - len(PAYLOAD):15.1f}" if holds_payload else f"{'':15}"
            print(f"{name:64} {per_message:10.1f} {beyond}")


if __name__ == "__main__":
    main()
