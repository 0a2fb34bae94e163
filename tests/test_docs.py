"""The README and the documentation site's pages: the README stays short enough to read on a package index and
enables both frameworks on its first screen; every Python example in them is valid Python. (The strict build of
the site, scripts/docs build, checks the links and anchors, the README's into the site included.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_readme_is_short_and_enables_both_frameworks_on_its_first_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 400
    first_screen = "\n".join(lines[:150])
    assert "broker.add_middleware(DelayMiddleware(" in first_screen  # Dramatiq
    assert 'app.conf.broker_transport = "delay_broker.celery.transport:RedisTransport"' in first_screen  # Celery
    assert (
        'pip install "delay-broker[dramatiq]"' in first_screen and 'pip install "delay-broker[celery]"' in first_screen
    )


def test_the_readme_has_no_relative_link_or_image_a_package_index_would_break():
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    assert targets
    assert [target for target in targets if not target.startswith("https://")] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_python_example_is_valid_python(page: Path):
    for block in PYTHON_BLOCK.findall(page.read_text()):
        compile(block, str(page), "exec")
