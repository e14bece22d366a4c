"""What a user sees: the progress bar of a step-based run, and ``make setup``'s packaging and report."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_progress_bar_counts_steps_out_of_max_steps_with_reward_pass_rate_and_speed(capsys, monkeypatch):
    """Lightning's bar read "Epoch 0" with a batch count and no total on a max_steps run."""
    from rlcode.callbacks import StepMetrics, StepProgressBar, progress
    from grpo_harness import build_module, fit_steps

    monkeypatch.setattr(progress, "interactive", lambda stream: True)  # as in a terminal

    fit_steps(build_module(), steps=2, enable_progress_bar=True,
              callbacks=[StepMetrics(print_steps=False), StepProgressBar()])
    out = capsys.readouterr().out
    final = re.split(r"[\r\n]", out.strip())[-1]
    assert final.startswith("steps: ") and "2/2" in final, final  # every mode's steps, not "GRPO steps"
    # a plain reward function counts no successes of its own: the share with a positive reward
    assert re.search(r"reward=-?[\d.]+", final) and re.search(r"positive=[\d.]+", final) and "tok/s=" in final, final
    assert "Epoch" not in out and "v_num" not in out


def test_progress_bar_stays_off_in_a_log_file(capsys):
    """Written to a file or a pipe (here pytest's capture), a bar is its redraws joined by \\r: the
    step lines say the same in plain lines."""
    from rlcode.callbacks import StepMetrics, StepProgressBar
    from grpo_harness import build_module, fit_steps

    fit_steps(build_module(), steps=2, enable_progress_bar=True, callbacks=[StepMetrics(), StepProgressBar()])
    out = capsys.readouterr().out
    assert "\r" not in out and "steps: " not in out
    assert [line.split(":")[0] for line in out.splitlines() if "Step " in line] == ["  Step 0", "  Step 1"], out


def test_pyproject_uses_an_spdx_license_string():
    """Guards: ``license = {text = ...}`` made setuptools print deprecation warnings in
    ``make setup``; the SPDX string needs setuptools >= 77 at build time."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    requirement = next(r for r in project["build-system"]["requires"] if r.startswith("setuptools"))
    assert int(re.search(r">=(\d+)", requirement).group(1)) >= 77
    assert {"nbclient", "nbformat", "ipykernel"} <= {re.split(r"[<>=\[ ]", r)[0]
                                                    for r in project["project"]["optional-dependencies"]["test"]}


def test_setup_report_names_versions_and_the_sandbox_level(capsys):
    from rlcode.cli.setup_report import main

    main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("installed: rlcode ") and "torch " in lines[0] and "lightning " in lines[0]
    assert re.match(r"sandbox isolation: (bwrap|bwrap-userns|process)", lines[1]), lines[1]
