"""A screenshot of the dashboard's overview, for the docs: ``scripts/screenshot`` (writes docs/dashboard.png).

Starts a private redis-server, parks messages the way real Dramatiq and Celery producers do (a StubBroker with
the DelayMiddleware, a Celery app with the delay_broker transport), dead-letters a few, serves the dashboard and
photographs it in Debian's headless Chromium through Playwright.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # python benchmarks/screenshot.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import dramatiq
import uvicorn
from celery import Celery
from dramatiq.brokers.stub import StubBroker
from playwright.sync_api import sync_playwright

from delay_broker import DelayStore, ListTarget, Promoter
from delay_broker.celery import install
from delay_broker.deliverers import DirectLists
from delay_broker.dramatiq import DelayMiddleware
from delay_broker.embedded import EmbeddedRedis, free_port
from delay_broker.web import create_app
from integration.browser import launch

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "shop"


def populate(server: EmbeddedRedis) -> DelayStore:
    broker = StubBroker()
    broker.add_middleware(DelayMiddleware(client=server.client(), namespace=NAMESPACE, threshold=1))
    reminder = dramatiq.actor(lambda user: None, broker=broker, actor_name="send_reminder", queue_name="emails")
    renewal = dramatiq.actor(lambda plan: None, broker=broker, actor_name="renew_plan", queue_name="billing")
    for n in range(240):
        reminder.send_with_options(args=(f"user-{n}",), delay=(30 + n * 97) * 1000 % 86_400_000)
    for n in range(60):
        renewal.send_with_options(args=(f"plan-{n}",), delay=(n + 1) * 3_600_000 * 24)
    app = Celery("shop", broker=server.url, set_as_current=False)
    install(app, threshold=1.0, namespace=NAMESPACE)
    for n in range(90):
        app.send_task("reports.weekly", args=[f"store-{n}"], countdown=600 + n * 1200)
    app.close()
    broker.close()
    store = DelayStore(server.client(), namespace=NAMESPACE)
    # Some promoted already (for the lateness chart): due within seconds, handed to a list by a promoter.
    for n in range(150):
        reminder.send_with_options(args=(f"soon-{n}",), delay=1100 + n * 15)
    promoter = Promoter(store, DirectLists({"emails": ListTarget(f"{NAMESPACE}:emails:ready")}), max_idle=0.5)
    promoter.start()
    time.sleep(4.5)
    promoter.stop()
    # A few overdue and a few dead, as on a real Monday.
    for n in range(7):
        reminder.send_with_options(args=(f"late-{n}",), delay=1500)
    time.sleep(2.5 + 4)
    claim = store.claim(3, 60, "screenshot")
    store.nack(
        claim.lease_deadline_ms,
        [(m.id, "delivery refused: queue 'emails' was deleted", "dead") for m in claim.messages],
    )
    return store


def main() -> None:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png"
    with EmbeddedRedis() as server:
        store = populate(server)
        port = free_port()
        web = uvicorn.Server(uvicorn.Config(create_app(store), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=web.run, daemon=True)
        thread.start()
        while not web.started:
            time.sleep(0.05)
        try:
            with sync_playwright() as playwright:
                browser = launch(playwright)
                page = browser.new_page(viewport={"width": 1280, "height": 820})
                page.goto(f"http://127.0.0.1:{port}/")
                page.screenshot(path=str(output), full_page=True)
                browser.close()
        finally:
            web.should_exit = True
            thread.join(10)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
