"""A config or command line of the form before ``model.mode`` gets one line naming the new form.

Run as the user runs it (a subprocess), so what is checked is the real stderr: exactly one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

OLD_SPIRAL = """model:
  class_path: rlcode.algorithms.spiral.SPIRAL
  init_args:
    model_name: tiny-random
    opponent: self
    num_generations: 2
"""
OLD_GRPO = """model:
  model_name: tiny-random
  rewards: [execution]
  filter_zero_std_groups: true
"""


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RLCODE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rlcode.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("text, expected", [
    (OLD_SPIRAL, ["rlcode: model.opponent, model.num_generations are settings of the mode now: write them under "
                  "model.mode.init_args (see docs/configs.md)",
                  "model.class_path rlcode.algorithms.spiral.SPIRAL is now model.mode.class_path rlcode.modes.SPIRAL"]),
    (OLD_GRPO, ["rlcode: model.rewards is a setting of the mode now: write it under model.mode.init_args",
                "model.filter_zero_std_groups is now model.skip_zero_advantage_rows"]),
])
def test_an_old_config_gets_one_line_naming_the_new_form(tmp_path, text, expected):
    config = tmp_path / "old.yaml"
    config.write_text(text)
    done = run("fit", "--config", str(config))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for part in expected:
        assert part in lines[0], lines[0]
    assert lines[0].endswith(f"({config})")


def test_old_flags_get_one_line_too():
    done = run("fit", "--config", "configs/spiral_tictactoe.yaml", "--model", "rlcode.algorithms.spiral.SPIRAL",
               "--model.opponent", "random")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0] == ("rlcode: --model rlcode.algorithms.spiral.SPIRAL is now --model.mode rlcode.modes.SPIRAL; "
                        "--model.opponent is a setting of the mode now: write it under model.mode.init_args "
                        "(see docs/configs.md) (on the command line)")


def test_every_config_in_the_repository_has_the_new_form():
    from rlcode.cli.old_form import check

    for config in sorted((REPO / "configs").rglob("*.yaml")):
        check(["fit", "--config", str(config)])  # raises on the old form
