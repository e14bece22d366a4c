"""`rlcode fit` on 2 CPU processes (DDP over gloo): sharded prompts, one gradient sync per step.

Lightning's "ddp" strategy starts rank 1 by re-running the command line of rank 0, so the run is a
separate script (this file run as ``python tests/test_grpo_ddp.py OUT_DIR``), not pytest itself: the
test starts it and reads what each rank wrote to OUT_DIR.

Each rank records the task ids it trained on, the model's backward passes, how many gradient
all-reduce rounds DDP ran (a counting communication hook: bucket 0 is reduced once per round),
a digest of its weights at the start and at the end, and its step metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts a two-rank run (10-20 s)

REPO = Path(__file__).resolve().parents[1]
STEPS = 2
MICRO_BATCHES_PER_STEP = 4  # 2 prompts x 4 generations / micro_batch_size 2


def count_gradient_syncs(state, bucket):
    """A DDP comm hook: the default all-reduce (averaging), counted per round."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if bucket.index() == 0:  # runs in __main__'s copy of this module
        _SYNC_ROUNDS[0] += 1
    return allreduce_hook(state, bucket)


_SYNC_ROUNDS = [0]


def _run_one_rank(out_dir: Path, reward: str, signal_rank_zero: str | None = None, sharded: bool = False) -> None:
    """Body of each rank: fit with recording patches, then write rank<N>.json.

    ``signal_rank_zero``: rank zero alone gets a stop request (as from SIGTERM) as its second step
    starts (``"signal"``) or in the first micro-batch of that step's update (``"update-signal"``).
    ``sharded``: under rlcode's FSDP2 strategy instead of DDP. Each rank records its stop token's asks
    per stop point: every rank must ask equally often at each.
    """
    import torch

    from rlcode.cli.command import main
    from rlcode.training import policy_update
    from rlcode.training.learner import Learner

    seen: dict = {"task_ids": [], "mean_rewards": [], "global_mean_rewards": [], "backwards": 0, "batch_idx": None}
    original_step, original_backward = Learner.training_step, Learner.manual_backward
    original_logps = policy_update.completion_logps

    def training_step(self, batch, batch_idx):
        seen["task_ids"].append(list(batch["task_id"]))
        seen["batch_idx"] = batch_idx
        seen["token"] = self.stop_token
        if signal_rank_zero == "signal" and self.trainer.global_rank == 0 and batch_idx == 1:
            self.stop_token.request("SIGTERM")
        original_step(self, batch, batch_idx)
        seen["mean_rewards"].append(self.last_step.mean_reward)
        seen["global_mean_rewards"].append(self.last_step.reward_metrics.get("avg_batch_reward_all_ranks"))

    def update_logps(*args, **kwargs):
        if signal_rank_zero == "update-signal" and os.environ.get("LOCAL_RANK", "0") == "0" and seen["batch_idx"] == 1:
            seen["token"].request("SIGTERM")
        return original_logps(*args, **kwargs)

    policy_update.completion_logps = update_logps

    def manual_backward(self, loss, *args, **kwargs):
        seen["backwards"] += 1
        return original_backward(self, loss, *args, **kwargs)

    def on_train_end(self):
        rank = self.trainer.global_rank
        seen.pop("token", None)
        asks = {point.value: count for point, count in self.stop_token.asks.items()}
        record = {**seen, "checksum": _weights_digest(self.policy), "rank": rank, "asks": asks,
                  "world_size": self.trainer.world_size, "sync_rounds": _SYNC_ROUNDS[0],
                  "global_step": self.trainer.global_step,
                  "strategy": type(self.trainer.strategy).__name__}
        (out_dir / f"rank{rank}.json").write_text(json.dumps(record))

    original_train_start = Learner.on_train_start

    def on_train_start(self):
        # Lightning registers DDPStrategy(ddp_comm_hook=...) on CUDA only: on CPU, by hand
        if not sharded:
            self.trainer.strategy.model.register_comm_hook(state=None, hook=count_gradient_syncs)
        seen["checksum_start"] = _weights_digest(self.policy)
        original_train_start(self)

    Learner.training_step, Learner.manual_backward, Learner.on_train_end = training_step, manual_backward, on_train_end
    Learner.on_train_start = on_train_start
    torch.set_num_threads(1)  # two processes share the machine's cores
    strategy = "fsdp" if sharded else json.dumps({"class_path": "lightning.pytorch.strategies.DDPStrategy",
                                                  "init_args": {"process_group_backend": "gloo"}})
    main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml"),
          "--run.root_dir", str(out_dir / "runs"),
          "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", strategy,
          "--trainer.max_steps", str(STEPS),
          # a length reward varies between completions, so every step has a gradient to sync
          "--model.mode.rewards", f"[execution, 'test_grpo_ddp:{reward}']", "--model.skip_zero_advantage_rows", "true",
          "--model.micro_batch_size", "2", "--model.mode.sandbox.workers", "1", "--data.num_train_tasks", "8",
          "--eval.at_start", "false", "--eval.at_end", "false", "--checkpoint.every_n_train_steps", "0"])


def _weights_digest(model) -> str:
    """sha256 of every weight's bytes: equal only if the ranks hold bit-identical weights (a sharded
    weight whole: a collective, every rank calls it)."""
    import hashlib

    import torch

    from rlcode.models.sharding import full_tensor

    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(full_tensor(tensor).detach().cpu().contiguous().view(-1).view(dtype=torch.uint8).numpy())
    return digest.hexdigest()


def length_reward(prompts, completions, **columns) -> list[float]:
    return [len(text) / 100.0 for text in completions]


def length_reward_on_rank_zero(prompts, completions, **columns) -> list[float]:
    """Rank 1 gets equal rewards: its groups are all filtered out, and it must still join the sync."""
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        return length_reward(prompts, completions)
    return [0.0 for _ in completions]


def _run_two_ranks(out_dir: Path, reward: str, *extra: str, timeout: float = 300) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(Path(__file__)), str(out_dir), reward, *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    (out_dir / "stdout.txt").write_text(done.stdout)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("reward", ["length_reward", "length_reward_on_rank_zero"])
def test_two_rank_fit_shards_prompts_and_keeps_weights_identical(tmp_path, reward):
    ranks = _run_two_ranks(tmp_path, reward)

    assert all(r["strategy"] == "DDPStrategy" and r["world_size"] == 2 for r in ranks)
    assert all(r["global_step"] == STEPS for r in ranks), "both ranks finish every optimizer step"
    tasks = [{t for batch in r["task_ids"] for t in batch} for r in ranks]
    assert tasks[0] and tasks[1] and not tasks[0] & tasks[1], f"ranks must see different prompts: {tasks}"
    assert len(tasks[0] | tasks[1]) == 8, "together the ranks cover the 8 training tasks (2 steps x 2 x 2)"

    idle_rank_backwards = STEPS if reward == "length_reward_on_rank_zero" else STEPS * MICRO_BATCHES_PER_STEP
    assert [r["backwards"] for r in ranks] == [STEPS * MICRO_BATCHES_PER_STEP, idle_rank_backwards]
    assert all(r["sync_rounds"] == STEPS for r in ranks), \
        f"gradients must all-reduce once per optimizer step, not per micro-batch: {[r['sync_rounds'] for r in ranks]}"
    assert ranks[0]["checksum_start"] != ranks[0]["checksum"], "the optimizer never changed the weights"
    assert ranks[0]["checksum"] == ranks[1]["checksum"], "after averaged gradients, both ranks hold the same weights"

    local = [r["mean_rewards"] for r in ranks]
    expected = [(a + b) / 2 for a, b in zip(*local)]
    for r in ranks:
        # float32 means of 4 and 8 positive rewards: each within 8 u = 4.8e-7 (u = 2^-24) of exact,
        # the mean of two local means within 5 u more, so they agree to rel 1e-6
        assert r["global_mean_rewards"] == pytest.approx(expected, rel=1e-6), "the logged reward mean covers every rank"

    # What a user reads counts every rank: 2 ranks x 2 prompts x 4 completions per step (rank zero
    # alone had printed half), and rollouts.jsonl holds both ranks' rows.
    out = (tmp_path / "stdout.txt").read_text()
    assert "  Total trajectories: 32" in out, out[-2000:]
    assert out.count("/16), ") >= STEPS and "/8), " not in out, out[-2000:]
    rows = [json.loads(line) for line in next(tmp_path.glob("runs/tiny/version_*/rollouts.jsonl")).read_text().splitlines()]
    assert sorted({row["rank"] for row in rows}) == [0, 1] and len(rows) == STEPS * 2 * 4
    for rank, seen in enumerate(tasks):
        assert {row["task_id"] for row in rows if row["rank"] == rank} == seen


def test_a_signal_to_one_rank_stops_every_rank_with_a_checkpoint(tmp_path):
    """Saving is collective: if rank zero alone stopped to save, both ranks would hang. Rank zero is
    signalled as step 1 starts: both ranks give step 1 up before its update and save step 0's end."""
    ranks = _run_two_ranks(tmp_path, "length_reward", "signal", timeout=150)
    assert [r["global_step"] for r in ranks] == [1, 1], "both ranks stop before the signalled step's update"
    assert ranks[0]["asks"] == ranks[1]["asks"] and ranks[0]["asks"]["after_collect"] == 2, ranks
    saved = list(tmp_path.glob("runs/tiny/version_*/checkpoints/last.ckpt"))
    assert saved, "the stop saved last.ckpt"
    import torch

    checkpoint = torch.load(saved[0], map_location="cpu", weights_only=False)
    assert len(checkpoint["rlcode_resume"]["rng_by_rank"]) == 2, "each rank's RNG states, for an exact resume"
    assert ranks[0]["checksum"] == ranks[1]["checksum"]


def test_a_signal_to_one_rank_during_the_update_stops_every_rank_before_the_optimizer_step(tmp_path):
    """Rank zero is signalled in the first micro-batch of step 1's update. The ranks agree before each
    micro-batch (as many times on each: the least count over ranks), so both leave at the second one:
    step 1 is given up with only gradients changed, which are cleared, and no all-reduce ran for it."""
    ranks = _run_two_ranks(tmp_path, "length_reward", "update-signal", timeout=150)
    assert [r["global_step"] for r in ranks] == [1, 1], "both ranks give the signalled step up"
    assert [r["backwards"] for r in ranks] == [MICRO_BATCHES_PER_STEP + 1] * 2, "one micro-batch of step 1 each"
    assert all(r["sync_rounds"] == 1 for r in ranks), "step 1's gradients were never all-reduced"
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert ranks[0]["asks"] == ranks[1]["asks"] and ranks[0]["asks"]["before_micro_batch"] >= 2, ranks
    assert list(tmp_path.glob("runs/tiny/version_*/checkpoints/last.ckpt")), "the stop saved last.ckpt"


@pytest.mark.parametrize("when", ["signal", "update-signal"])
def test_under_fsdp_every_rank_asks_at_every_stop_point_equally_often(tmp_path, when):
    """The stop points' asks, counted per rank (``StopToken.asks``), under FSDP2 on two CPU ranks with
    rank zero alone signalled: equal counts are what keeps the sharded collectives in step."""
    ranks = _run_two_ranks(tmp_path, "length_reward", when, "fsdp", timeout=300)
    assert [r["global_step"] for r in ranks] == [1, 1], "both ranks give the signalled step up"
    assert ranks[0]["asks"] == ranks[1]["asks"] and {"after_collect", "step_end"} <= set(ranks[0]["asks"]), ranks
    assert ranks[0]["checksum"] == ranks[1]["checksum"]


def test_a_signal_to_one_rank_during_the_start_eval_stops_every_rank_between_batches(tmp_path):
    """Generation can be collective (FSDP gathers the weights): a rank leaving the eval alone would
    leave the other waiting forever. The ranks agree at each batch boundary and leave together."""
    ranks = _run_two_ranks(tmp_path, "eval-signal", timeout=150)
    assert [r["eval_batches"] for r in ranks] == [1, 1], "both ranks stop after the batch in flight"
    assert ranks[0]["asks"] == ranks[1]["asks"] and ranks[0]["asks"]["eval_batch"] == 2, ranks
    assert [r["global_step"] for r in ranks] == [0, 0] and not list(tmp_path.rglob("eval/*.json"))


def _run_eval_signal_rank(out_dir: Path) -> None:
    """Body of each rank: rank zero alone gets a stop request (as from SIGTERM) during the start eval's
    first batch; each rank writes how many eval batches it generated."""
    import torch

    from rlcode.cli.command import main
    from rlcode.eval import policy_scoring
    from rlcode.training.learner import Learner

    batches, original_generate = [0], policy_scoring._generate

    def generate(module, *args, **kwargs):
        batches[0] += 1
        if module.global_rank == 0:
            module.stop_token.request("SIGTERM")
        return original_generate(module, *args, **kwargs)

    def on_train_end(self):
        record = {"eval_batches": batches[0], "global_step": self.trainer.global_step,
                  "asks": {point.value: count for point, count in self.stop_token.asks.items()}}
        (out_dir / f"rank{self.trainer.global_rank}.json").write_text(json.dumps(record))

    policy_scoring._generate, Learner.on_train_end = generate, on_train_end
    torch.set_num_threads(1)
    strategy = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"process_group_backend": "gloo"}}
    main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
          "--config", str(REPO / "configs/tiny_grpo.yaml"), "--run.root_dir", str(out_dir / "runs"),
          "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", json.dumps(strategy),
          "--model.mode.sandbox.workers", "1", "--eval.num_questions", "4", "--eval.batch_size", "1"])


def _run_equivalence(out_dir: Path, devices: int) -> None:
    """One GRPO step on fixed rollouts (grpo_harness): 2 prompts per rank on ``devices`` ranks, or
    the same 4 prompts on one device; rank zero saves the update's (all-reduced) gradients."""
    import torch

    from grpo_harness import GradientRecorder, build_module, fit_steps

    torch.set_num_threads(1)
    recorder = GradientRecorder()
    # grpo (per-sequence means), batch-std scaling and micro-batches of 3 over 4 rows per rank (a
    # partial last one): each weighed by local counts before; the step's totals over ranks now.
    module = build_module(loss_type="grpo", scale_rewards="batch", micro_batch_size=3, configure=False, float64=True)
    strategy = "auto" if devices == 1 else __import__("lightning").pytorch.strategies.DDPStrategy(
        process_group_backend="gloo")
    trainer = fit_steps(module, steps=1, prompts_per_step=4 // devices, callbacks=[recorder],
                        devices=devices, strategy=strategy)
    if trainer.global_rank == 0:
        torch.save({"gradients": recorder.updates[0], "advantages": module.last_step.advantages},
                   out_dir / f"gradients_{devices}.pt")


def test_two_rank_step_equals_one_rank_step_on_the_combined_batch(tmp_path):
    """A 2-process DDP step gives the gradient of a 1-process step on both
    ranks' rows together (not only "the two ranks agree"): loss normalisers are step totals over
    ranks, and scale_rewards="batch" divides by the std of every rank's rewards."""
    import torch

    from grpo_harness import assert_same_gradients

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    for devices in (1, 2):
        done = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path), "equivalence", str(devices)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
    one = torch.load(tmp_path / "gradients_1.pt")
    two = torch.load(tmp_path / "gradients_2.pt")
    # rank 0's advantages are the first half of the combined batch's: same batch std (exactly: the
    # harness's rewards are multiples of 1/8, so every sum over them is exact in any order)
    assert two["advantages"] == one["advantages"][:len(two["advantages"])]
    assert_same_gradients(two["gradients"], one["gradients"])


def _run_spiral_rank(out_dir: Path) -> None:
    """SPIRAL self-play on 2 ranks: each rank writes its role baselines and the games it played."""
    import torch

    from rlcode.cli.command import main
    from rlcode.training.learner import Learner

    def on_train_end(self):
        record = {"baselines": self.mode.baselines.state_dict()["values"], "games": self.last_step.task_ids,
                  "global_step": self.trainer.global_step}
        (out_dir / f"spiral_rank{self.trainer.global_rank}.json").write_text(json.dumps(record))

    Learner.on_train_end = on_train_end
    torch.set_num_threads(1)
    strategy = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"process_group_backend": "gloo"}}
    main(["fit", "--config", str(REPO / "configs/spiral_tictactoe.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
          "--run.root_dir", str(out_dir / "runs"), "--trainer.devices", "2", "--trainer.strategy", json.dumps(strategy),
          "--model.mode.opponent", "random", "--game_eval.at_start", "false", "--game_eval.at_end", "false"])


def test_spiral_role_baselines_agree_across_ranks(tmp_path):
    """RAE under DDP: each rank plays its own games, the baselines fold every rank's returns in rank
    order, so both ranks hold the same baselines (and a checkpoint of rank 0 resumes every rank)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path), "spiral"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"spiral_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 2
    assert ranks[0]["baselines"] and ranks[0]["baselines"] == ranks[1]["baselines"]
    # The random model loses every game by an invalid move (-1.5). Seats alternate over each rank's 4
    # episodes per step: 2 ranks x 2 steps x 2 = 8 returns per role folded in (4 if each rank kept
    # only its own).
    for role in (0, 1):
        assert ranks[0]["baselines"][f"TicTacToe-v0/{role}"] == pytest.approx(-1.5 * (1 - 0.95**8))


if __name__ == "__main__":
    if sys.argv[2] == "spiral":
        _run_spiral_rank(Path(sys.argv[1]))
        sys.exit(0)
    if sys.argv[2] == "eval-signal":
        _run_eval_signal_rank(Path(sys.argv[1]))
        sys.exit(0)
    if sys.argv[2] == "equivalence":
        _run_equivalence(Path(sys.argv[1]), int(sys.argv[3]))
        sys.exit(0)
    _run_one_rank(Path(sys.argv[1]), sys.argv[2], signal_rank_zero=next(iter(sys.argv[3:]), None),
                  sharded="fsdp" in sys.argv[4:])
