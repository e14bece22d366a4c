"""benchmarks/device_wheels.py: what a GPU lease carries is the lock's versions of what the image lacks,
and the device-stack venv gets the image's versions of what it has (no download here: the lists)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import device_wheels  # noqa: E402

LOCK = """\
# header
alpha==1.0
    # via rlcode (pyproject.toml)
beta==2.0 ; sys_platform == 'linux'
    # via
    #   alpha
    #   trl
gamma==3.0 ; sys_platform == 'win32'
    # via alpha
trl==1.16.0
    # via rlcode (pyproject.toml)
"""


def _files(tmp_path: Path, image: str) -> tuple[Path, Path]:
    (tmp_path / "lock.txt").write_text(LOCK)
    (tmp_path / "image.txt").write_text(image)
    return tmp_path / "lock.txt", tmp_path / "image.txt"


def test_the_lock_graph_reads_via_comments_and_drops_other_platforms(tmp_path):
    lock, _ = _files(tmp_path, "")
    assert device_wheels.lock_requirements(lock) == {"rlcode": {"alpha", "trl"}, "alpha": {"beta"}, "trl": {"beta"}}


def test_the_stack_takes_the_image_version_where_one_was_read_and_the_lock_otherwise(tmp_path, monkeypatch):
    lock, image = _files(tmp_path, "# comment\nbeta==2.5\nalpha\nunrelated==9\n")
    monkeypatch.setattr(device_wheels, "CARRIED", ["trl"])
    assert device_wheels.device_stack_requirements("2.13.0", lock, image) == ["torch==2.13.0", "alpha==1.0", "beta==2.5"]


def test_a_carried_package_on_the_image_or_missing_from_the_lock_is_refused(tmp_path, monkeypatch):
    lock, image = _files(tmp_path, "beta\n")
    monkeypatch.setattr(device_wheels, "CARRIED", ["trl", "beta"])
    with pytest.raises(SystemExit, match="already on the device image.*would shadow it: beta"):
        device_wheels.carried_pins(lock, image)
    monkeypatch.setattr(device_wheels, "CARRIED", ["trl", "delta"])
    with pytest.raises(SystemExit, match="not in lock.txt: delta"):
        device_wheels.carried_pins(lock, image)


def test_the_real_carried_set_is_pinned_and_not_on_the_image():
    pins = device_wheels.carried_pins()
    assert pins["trl"] == device_wheels.locked_versions()["trl"] and set(pins).isdisjoint(device_wheels.image_packages())
