"""The quickstart config with the real SmolLM2-135M-Instruct, shrunk to two small steps plus eval."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from rlcode.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_quickstart_config_trains_the_embedded_model(tmp_path, capsys):
    main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--run.root_dir", str(tmp_path),
          "--trainer.max_steps", "2", "--model.num_generations", "4", "--model.max_new_tokens", "48",
          "--data.prompts_per_step", "2", "--eval.num_questions", "2", "--eval.max_new_tokens", "48",
          "--trainer.enable_progress_bar", "false"])
    run = next(tmp_path.glob("quickstart/version_*"))

    with (run / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("reward/avg_batch_reward")]
    assert len(rows) == 2
    for row in rows:
        reward = float(row["reward/avg_batch_reward"])
        assert -1.0 <= reward <= 2.0 and not math.isnan(reward)  # execution (-1..1) + tests fraction (0..1)
        assert float(row["completions/mean_length"]) > 0
    rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert all(r["verdict"] for r in rollouts), "every sampled completion carries the sandbox's verdict"
    assert any("def " in r["completion"] or "```" in r["completion"] for r in rollouts), "the model writes code"

    first, last = (json.loads((run / f"eval/step_{s}.json").read_text()) for s in (0, 2))
    assert len(first["problems"]) == len(last["problems"]) == 2
    assert (run / "plots/training.png").is_file() and (run / "checkpoints/last.ckpt").is_file()
    assert "MBPP pass rate (2 problems)" in capsys.readouterr().out
