"""The quickstart config with the real SmolLM2-135M-Instruct, shrunk to two small steps plus eval."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from rlcode.cli.command import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_quickstart_config_trains_the_embedded_model(tmp_path, capsys):
    main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--run.root_dir", str(tmp_path),
          "--trainer.max_steps", "2", "--model.mode.num_generations", "4", "--model.max_new_tokens", "48",
          "--data.prompts_per_step", "2", "--eval.num_questions", "2", "--eval.max_new_tokens", "48",
          "--trainer.enable_progress_bar", "false"])
    run = next(tmp_path.glob("quickstart/version_*"))

    with (run / "metrics.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("reward/avg_batch_reward")]
    assert len(rows) == 2
    # The learning signal the quickstart exists to show: the execution reward differs within some
    # group (measured: within-group std ~0.5 for this model), so some step has a gradient, and the
    # optimizer moves the weights away from the embedded model's.
    assert any(float(r["reward/frac_reward_zero_std"]) < 1.0 for r in rows), "no group had any reward signal"
    assert any(r.get("train/grad_norm") and float(r["train/grad_norm"]) > 0 for r in rows), "no step had a gradient"
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

    import torch

    from rlcode.models import load_model

    trained = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    start = load_model("smollm2-135m-instruct").state_dict()
    assert any(not torch.equal(trained[f"policy.{name}"], value) for name, value in start.items()), \
        "two steps with reward signal must change the weights"
