"""Dashboard at scale: the first page of a filtered view over 1,000,000 parked messages, and the web process's
memory while paging.

    python benchmarks/bench_dashboard.py [--messages 1000000]

Starts a private redis-server, parks the messages (10 actors over 5 queues, 250-byte payloads, due over 30
days; 1 in 1,000 is a 'refund' whose payload names customer 'acme'), starts ``delay-broker web`` as its own
process, and prints ``name=value`` lines:

- dashboard_first_page_ms: the slowest of 5 loads of the first page of each filtered view (task, queue, text,
  due window), HTTP request to full response (target < 1000);
- dashboard_unfiltered_first_page_ms: the same for the unfiltered list, for comparison;
- dashboard_rss_start_mb / dashboard_rss_end_mb: the web process's resident memory after the first page and
  after paging 200 pages of each view (flat: the growth is what one page needs, not what the store holds).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil

if __package__ in (None, ""):  # python benchmarks/bench_dashboard.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

from delay_broker import DelayStore, Envelope, ParkRequest
from delay_broker.embedded import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parents[1]
ACTORS = [(f"task_{n}", f"queue_{n % 5}") for n in range(9)] + [("refund", "payments")]


def park(store: DelayStore, count: int) -> None:
    filler = "x" * 180
    batch: list[ParkRequest] = []
    for n in range(count):
        actor, queue = ("refund", "payments") if n % 1000 == 7 else ACTORS[n % 9]
        customer = "acme" if actor == "refund" else f"c{n % 5000}"
        body = {"actor_name": actor, "queue_name": queue, "args": [customer, n], "kwargs": {}, "pad": filler}
        envelope = Envelope(route=queue, payload=json.dumps(body).encode(), framework="dramatiq", name=actor)
        batch.append(ParkRequest(f"{n:08d}-{uuid.uuid4().hex[:8]}", envelope, delay=60 + (n * 2.6) % 2_592_000))
        if len(batch) == 1000:
            store.park_many(batch)
            batch = []
    if batch:
        store.park_many(batch)


def get(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read().decode()
    return (time.perf_counter() - started) * 1000, body


def next_cursor(body: str) -> str | None:
    marker = 'id="next-page" href="'
    if marker not in body:
        return None
    link = body.split(marker, 1)[1].split('"', 1)[0].replace("&amp;", "&")
    return link.split("?", 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--pages", type=int, default=200)
    args = parser.parse_args()
    with EmbeddedRedis() as server:
        store = DelayStore(server.client(), namespace="bench-dashboard")
        started = time.perf_counter()
        park(store, args.messages)
        print(f"# parked {store.stats().parked:,} messages in {time.perf_counter() - started:.0f} s", flush=True)
        port = free_port()
        web = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "delay_broker",
                "web",
                "-r",
                server.url,
                "-n",
                "bench-dashboard",
                "--port",
                str(port),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    get(base + "/")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            process = psutil.Process(web.pid)
            views = {
                "task": "/messages?state=due&task=refund",
                "queue": "/messages?state=due&queue=queue_3",
                "text": "/messages?state=due&text=acme",
                "window": "/messages?state=due&from=10d&to=11d&task=task_4",
            }
            first = {name: max(get(base + path)[0] for _ in range(5)) for name, path in views.items()}
            unfiltered = max(get(base + "/messages?state=due")[0] for _ in range(5))
            rss_start = process.memory_info().rss / 2**20
            for path in views.values():
                query: str | None = path.split("?", 1)[1]
                for _ in range(args.pages):
                    if query is None:
                        break
                    _, body = get(f"{base}/messages?{query}")
                    query = next_cursor(body)
            rss_end = process.memory_info().rss / 2**20
        finally:
            web.terminate()
            web.wait(20)
    print(
        "# first page of each filtered view, slowest of 5 loads (ms): "
        + json.dumps({k: round(v) for k, v in first.items()})
    )
    print(f"dashboard_first_page_ms={max(first.values()):.0f}")
    print(f"dashboard_unfiltered_first_page_ms={unfiltered:.0f}")
    print(f"dashboard_rss_start_mb={rss_start:.1f}")
    print(f"dashboard_rss_end_mb={rss_end:.1f}")


if __name__ == "__main__":
    main()
