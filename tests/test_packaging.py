"""What an install puts into site-packages: rlcode and nothing else at the top level.

The repository keeps its callbacks in a top-level ``callbacks/`` folder; a wheel that shipped it as
is would install a package named ``callbacks``, which shadows (or is shadowed by) any other package
of that common name. ``rlcode/callbacks`` links to the folder, so the wheel carries it as
``rlcode.callbacks``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    had_build_dir = (ROOT / "build").exists()
    # No build isolation: the venv's setuptools builds it, so the test needs no network.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True)
    if not had_build_dir:  # setuptools leaves build/ in the checkout; a later build could reuse stale files
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    (wheel,) = out.glob("rlcode-*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_wheel_installs_only_rlcode_at_the_top_level(wheel_names):
    top_level = {name.split("/")[0] for name in wheel_names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"rlcode"}


def test_the_callbacks_ship_inside_rlcode(wheel_names):
    shipped = {Path(name).name for name in wheel_names if name.startswith("rlcode/callbacks/")}
    in_repository = {path.name for path in (ROOT / "callbacks").glob("*.py")}
    assert in_repository and shipped == in_repository
