"""Bad set-up reaches the user as one line naming the cause and the fix, not a traceback."""

from pathlib import Path

import pytest

from rlcode.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml")]


def test_missing_dataset_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "mbpp.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *TINY, "--run.root_dir", str(tmp_path), "--data.source", str(missing)])
    message = str(exit_info.value.code)
    assert message.startswith("rlcode: ") and "\n" not in message
    assert str(missing) in message
