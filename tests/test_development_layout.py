"""docs/development.md's layout names every package under rlcode/: a package added or moved shows up there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_layout_names_every_package_under_rlcode():
    text = (REPO / "docs" / "development.md").read_text()
    layout = text[text.index("Layout:"):text.index("Two\ndepartures")]
    named = set(re.findall(r"`rlcode/(\w+)/`", layout))
    packages = {path.parent.name for path in (REPO / "rlcode").glob("*/*.py")}  # namespace packages too (envs/)
    assert packages, "no packages found under rlcode/"
    assert not packages - named, f"docs/development.md's layout omits {sorted(packages - named)}"
    assert not named - packages, f"docs/development.md's layout names no package {sorted(named - packages)}"


def test_the_layout_names_every_module_at_the_top_of_rlcode_and_there_are_few():
    text = (REPO / "docs" / "development.md").read_text()
    layout = text[text.index("Layout:"):text.index("Two\ndepartures")]
    modules = {path.name for path in (REPO / "rlcode").glob("*.py")} - {"__init__.py"}
    assert len(modules) <= 5, f"rlcode/ holds packages and at most five modules, not {sorted(modules)}"
    named = set(re.findall(r"`rlcode/(\w+\.py)`", layout))
    assert named == modules, f"docs/development.md's layout names {sorted(named)}, rlcode/ holds {sorted(modules)}"
