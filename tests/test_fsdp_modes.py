"""Every mode under FSDP: 2 CPU ranks over gloo, one step of SPIRAL (self-play and a frozen opponent),
multi-step MBPP and the code game with a frozen predictor, each run twice through ``rlcode fit``,
under DDP and under FSDP, in float64. DDP is shown equal to one process on the combined batch
(tests/test_grpo_ddp.py, test_advantage_estimators_ddp.py); here FSDP must equal DDP: the same
rollouts (generation gathers the shards; the frozen copies are sharded alike), the same gradients at
the update (SPIRAL's ranks train different numbers of turn rows, which the zero-weighted padding passes
must absorb) and the same weights after it.

The tiny random model solves nothing, so the multi-step and code-game rewards would be flat: both get
a deterministic bonus of (characters of the answer that ends the episode mod 5) / 8 on every seat's return (exact in float32,
the same on every layout), so their updates move the weights. Each run is this file as a script
(Lightning re-runs the command line for rank 1): ``python tests/test_fsdp_modes.py OUT MODE STRATEGY``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each mode runs 2 two-rank fits (20-40 s each)

REPO = Path(__file__).resolve().parents[1]
LEARNING_RATE, ADAM_EPS = 1e-3, 1e-8
MODES = {
    "spiral_self": ["--config", "configs/spiral_tictactoe.yaml", "--data.init_args.episodes_per_step", "3"],
    "spiral_frozen": ["--config", "configs/spiral_tictactoe.yaml", "--data.init_args.episodes_per_step", "3",
                      "--model.mode.init_args.opponent", "frozen"],
    "multistep": ["--config", "configs/multistep_mbpp.yaml", "--data.num_train_tasks", "8", "--data.curriculum", "null",
                  "--model.skip_zero_advantage_rows", "false", "--model.mode.init_args.sandbox.workers", "1"],
    "code_game": ["--config", "configs/code_game.yaml", "--model.mode.init_args.opponent", "frozen",
                  "--model.mode.init_args.sandbox.workers", "1"],
}


def _bonus(text: str) -> float:
    return (len(text) % 5) / 8


def _patch_rewards() -> None:
    """Signal for the modes whose tiny-model rewards are flat (see the module docstring)."""
    from rlcode.envs.code_game import CodeGameEnv
    from rlcode.envs.mbpp_feedback import MBPPFeedbackEnv

    for env in (MBPPFeedbackEnv, CodeGameEnv):
        def step_with_bonus(self, answer, _step=env.step):
            result = _step(self, answer)
            if result.returns:
                result.returns = {seat: value + _bonus(answer) for seat, value in result.returns.items()}
            return result
        env.step = step_with_bonus


def _run(out: Path, mode: str, strategy: str) -> None:
    import torch

    import rlcode.training.learner as learner_module
    from exact_float64 import in_float64
    from rlcode.cli.command import main
    from rlcode.models.sharding import full_tensor

    torch.set_num_threads(1)
    load_model = learner_module.load_model
    learner_module.load_model = lambda *args, **kwargs: in_float64(load_model(*args, **kwargs))  # before sharding
    _patch_rewards()
    saved: dict = {"gradients": {}}
    Learner = learner_module.Learner
    before_step = Learner.on_before_optimizer_step

    def record_gradients(self, optimizer) -> None:  # every rank: full_tensor gathers under FSDP
        saved["gradients"] = {name: full_tensor(p.grad.detach()).clone() for name, p in self.policy.named_parameters()
                              if p.requires_grad and p.grad is not None}
        before_step(self, optimizer)

    def record_weights(self) -> None:
        weights = {name: full_tensor(p.detach()).clone() for name, p in self.policy.named_parameters()}
        if self.global_rank == 0:
            torch.save({**saved, "weights": weights, "updated": bool(self.last_step and self.last_step.updated)},
                       out / f"{mode}_{strategy}.pt")
    Learner.on_before_optimizer_step, Learner.on_train_end = record_gradients, record_weights
    main(["fit", *MODES[mode], "--config", "configs/tiny_test.yaml", "--run.root_dir", str(out / f"{mode}_{strategy}"),
          "--trainer.max_steps", "1", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
          "--trainer.strategy", strategy, "--trainer.precision", "32-true",
          "--model.learning_rate", str(LEARNING_RATE),
          "--eval.at_start", "false", "--eval.at_end", "false", "--checkpoint.every_n_train_steps", "0"])


def _rollouts(run_root: Path) -> list:
    """rollouts.jsonl's rows (prompts, completions or whole episodes, rewards), timings left out."""
    def untimed(value):
        if isinstance(value, dict):
            return {key: untimed(item) for key, item in value.items() if "time" not in key and "second" not in key}
        return [untimed(item) for item in value] if isinstance(value, list) else value
    (rollouts,) = run_root.glob("*/version_0/rollouts.jsonl")
    rows = [untimed(json.loads(line)) for line in rollouts.read_text().splitlines()]
    assert rows, f"no rollouts in {rollouts}"
    return rows


@pytest.mark.parametrize("mode", list(MODES))
def test_a_sharded_step_equals_ddp_in_every_mode(tmp_path, mode):
    import torch

    from exact_float64 import FLOAT64_TOLERANCE
    from grpo_harness import assert_same_gradients

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    for strategy in ("ddp", "fsdp"):
        done = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path), mode, strategy], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ddp, fsdp = torch.load(tmp_path / f"{mode}_ddp.pt"), torch.load(tmp_path / f"{mode}_fsdp.pt")
    assert _rollouts(tmp_path / f"{mode}_fsdp") == _rollouts(tmp_path / f"{mode}_ddp"), "the same rollouts"
    assert ddp["updated"] and fsdp["updated"]
    assert_same_gradients(fsdp["gradients"], ddp["gradients"])
    for name, weight in ddp["weights"].items():  # one AdamW step: see tests/test_fsdp.py for the bound
        gradient = ddp["gradients"].get(name)
        scale = float(gradient.abs().max()) if gradient is not None else 0.0
        allowed = LEARNING_RATE / ADAM_EPS * FLOAT64_TOLERANCE * scale + FLOAT64_TOLERANCE * float(weight.abs().max())
        assert float((fsdp["weights"][name] - weight).abs().max()) <= allowed, name


if __name__ == "__main__":
    _run(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
