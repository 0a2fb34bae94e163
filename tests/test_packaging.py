"""What the package declares agrees with what CI tests: the floors of pyproject.toml are the versions of
ci/oldest.txt (scripts/matrix installs those), the classifiers name the Pythons CI runs, the licence is shipped."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib; the test extra does not bring tomli
    tomllib = pytest.importorskip("tomli")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements() -> list[str]:
    project = pyproject()["project"]
    return [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]


def floor_of(name: str) -> set[str]:
    """Every ``>=`` floor pyproject.toml gives ``name`` (in its dependencies and extras)."""
    pattern = re.compile(rf"^{re.escape(name)}(\[[^\]]*\])?\s*>=\s*([^,;\s]+)", re.IGNORECASE)
    return {match.group(2) for match in map(pattern.match, requirements()) if match}


def test_the_floors_are_the_oldest_versions_ci_tests():
    pins = {}
    for line in (ROOT / "ci" / "oldest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    assert len(pins) >= 9
    for name, version in pins.items():
        assert floor_of(name) == {version}, f"{name}: pyproject.toml says {floor_of(name)}, ci/oldest.txt {version}"


def test_the_classifiers_name_the_pythons_ci_runs_and_requires_python_agrees():
    project = pyproject()["project"]
    versions = {
        c.rsplit(" ", 1)[1] for c in project["classifiers"] if re.match(r"Programming Language :: Python :: 3\.\d+$", c)
    }
    assert versions == {"3.10", "3.11", "3.12", "3.13"}
    assert project["requires-python"] == ">=3.10"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'OLDEST_PYTHON_VERSION="3.10"' in setup and 'NEWEST_PYTHON_VERSION="3.13"' in setup


def test_the_mit_licence_is_in_the_repository_and_declared():
    project = pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text
