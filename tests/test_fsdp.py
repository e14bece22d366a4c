"""FSDP2 (``--trainer.strategy fsdp``) on 2 CPU processes over gloo: a sharded GRPO step equals a
1-process step on the combined batch, gradients and weights after the step, in float64.

Lightning starts rank 1 by re-running the command line, so each run is this file as a script
(``python tests/test_fsdp.py OUT_DIR equivalence DEVICES VARIANT``); rank 0 saves what it saw. The
comparison holds to float64 rounding (``exact_float64``); a wrong normaliser, a gradient that missed
the reduce-scatter or an optimizer holding a gathered copy instead of the shard is off by far more.
The runs count the fused head's and the packed pass's calls: both must really run sharded
(FSDP's sharded head weight once made the log-probs fall back to full logits without a word).

The update runs FSDP as designed (``rlcode.training.policy_update``): the "uneven" run gives the ranks
different micro-batch counts (a token budget over rows of different lengths) on a 6-layer model, and
counts FSDP's collectives during the update: every rank runs the same number of passes, each
reduce-scatters every group's gradient, and no all-gather finds more than the root and two layers
already gathered (a whole-model gather holds all 7 groups).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts 1- and 2-rank runs (10-30 s)

REPO = Path(__file__).resolve().parents[1]
LEARNING_RATE, ADAM_EPS = 1e-3, 1e-8  # grpo_harness's learning rate; torch's AdamW eps (the Learner's)
# The KL variants score a reference: under full fine-tuning a frozen copy, sharded like the policy;
# under LoRA the policy with its adapters off. Checkpointed: each layer's forward runs again in backward
# (the A100 and V100 profiles' setting), inside the gathered update.
VARIANTS = {"full": {}, "full_kl": {"beta": 0.04}, "checkpointed": {"gradient_checkpointing": True},
            "lora_kl": {"lora": {"r": 4, "alpha": 8, "dropout": 0.0}, "beta": 0.04},
            "uneven": {"micro_batch_size": 8, "micro_batch_tokens": 12}}
DEEP_LAYERS = 6  # the "uneven" run's model: the tiny random one with more layers than FSDP may hold gathered
MOST_GATHERED_GROUPS = 3  # the root, the layer running and the one FSDP prefetches


def _deep_model(folder: Path) -> Path:
    """The tiny random model's folder with DEEP_LAYERS random layers (seeded: the same for every run)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcode.models.tiny_random import tiny_random_folder

    if not folder.exists():
        shutil.copytree(tiny_random_folder(), folder)
        config = AutoConfig.from_pretrained(folder)
        config.num_hidden_layers, config.layer_types = DEEP_LAYERS, config.layer_types[:1] * DEEP_LAYERS
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def _count_update_collectives(learner_module) -> dict:
    """Per update: FSDP's all-gathers and reduce-scatters, the most groups found gathered at an all-gather
    and each rank's micro-batch count (filled while the run trains)."""
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group

    import rlcode.training.policy_update as policy_update
    from rlcode.models.sharding import fsdp_modules

    seen = {"all_gathers": 0, "reduce_scatters": 0, "most_gathered": 0, "micro_batches": [], "groups": 0,
            "trained_groups": 0}
    groups: list = []
    in_update = [False]
    gather, reduce, split, update = (param_group.foreach_all_gather, param_group.foreach_reduce,
                                     policy_update.split_rows, learner_module.update_policy)

    def counted_gather(*args, **kwargs):
        if in_update[0]:
            seen["all_gathers"] += 1
            held = sum(group.is_unsharded for group in groups)
            seen["most_gathered"] = max(seen["most_gathered"], held + 1)
        return gather(*args, **kwargs)

    def counted_reduce(*args, **kwargs):
        seen["reduce_scatters"] += in_update[0]
        return reduce(*args, **kwargs)

    def counted_split(*args, **kwargs):
        parts = split(*args, **kwargs)
        seen["micro_batches"].append(len(parts))
        return parts

    def watched_update(policy, *args, **kwargs):
        groups[:] = [g for g in (m._get_fsdp_state()._fsdp_param_group for m in fsdp_modules(policy)) if g is not None]
        seen["groups"] = len(groups)
        seen["trained_groups"] = sum(any(p.sharded_param.requires_grad for p in g.fsdp_params) for g in groups)
        in_update[0] = True
        try:
            return update(policy, *args, **kwargs)
        finally:
            in_update[0] = False
    param_group.foreach_all_gather, param_group.foreach_reduce = counted_gather, counted_reduce
    policy_update.split_rows, learner_module.update_policy = counted_split, watched_update
    return seen


def _run_equivalence(out_dir: Path, devices: int, variant: str) -> None:  # noqa: C901 (one run, told in order)
    """One GRPO step on fixed rollouts (grpo_harness): 2 prompts per rank on 2 FSDP ranks, or the same
    4 prompts on one process; rank 0 saves the update's whole gradients and the weights after it."""
    import torch

    import rlcode.logprobs.sequence_logps as sequence_logps
    import rlcode.training.kl_reference as kl_reference
    import rlcode.training.learner as learner_module
    from exact_float64 import in_float64
    from grpo_harness import build_module, fit_steps
    from rlcode.models.sharding import full_tensor
    from rlcode.training.fsdp_strategy import FSDP2Strategy

    torch.set_num_threads(1)
    calls = {"fused_head": 0, "packed": 0}
    for name in calls:
        original = getattr(sequence_logps, f"{name}_{'logps' if name == 'fused_head' else 'outputs'}")

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)
        setattr(sequence_logps, original.__name__, counted)
    load_model = learner_module.load_model

    def load_in_float64(*args, **kwargs):  # before sharding; LoRA's random start seeded per rank: rank 1's
        torch.manual_seed(int(os.environ.get("LOCAL_RANK", 0)))  # must be replaced by rank 0's, as in DDP
        default = torch.get_default_dtype()  # "64-true" makes it float64 while building: draw as FSDP's run does
        torch.set_default_dtype(torch.float32)
        try:
            return in_float64(load_model(*args, **kwargs))
        finally:
            torch.set_default_dtype(default)
    learner_module.load_model = load_in_float64
    collectives = _count_update_collectives(learner_module) if devices > 1 else {}
    kl_reference.compute_dtype = lambda precision: torch.float64  # the reference copy's dtype: float64 in both runs

    gradients = {}

    class Recorder(__import__("lightning").Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:  # every rank: full_tensor gathers
            for name, p in pl_module.policy.named_parameters():
                if p.requires_grad:
                    gradients[name] = None if p.grad is None else full_tensor(p.grad.detach()).clone()

    # grpo (per-sequence means), batch-std scaling, micro-batches of 3 over 4 rows per rank: a partial
    # last one, and rank 0 and 1 pack different prompt trees in the packed pass.
    settings = {"micro_batch_size": 3, **VARIANTS[variant]}
    if variant == "uneven":
        settings["model_name"] = str(out_dir / "deep")
    module = build_module(loss_type="grpo", scale_rewards="batch", configure=False, precision="64-true", **settings)
    sharded = devices > 1
    trainer = fit_steps(module, steps=1, prompts_per_step=4 // devices, callbacks=[Recorder()], devices=devices,
                        strategy=FSDP2Strategy() if sharded else "auto", precision="32-true" if sharded else "64-true")
    weights = {name: full_tensor(p.detach()).clone() for name, p in module.policy.named_parameters()}
    torch.save(collectives, out_dir / f"{variant}_{devices}_collectives_{trainer.global_rank}.pt")
    if trainer.global_rank == 0:
        torch.save({"gradients": gradients, "weights": weights, "calls": calls,
                    "sharded": type(module.policy).__name__}, out_dir / f"{variant}_{devices}.pt")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_sharded_step_equals_one_process_on_the_combined_batch(tmp_path, variant):
    import torch

    from exact_float64 import FLOAT64_TOLERANCE
    from grpo_harness import assert_same_gradients

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    if variant == "uneven":
        _deep_model(tmp_path / "deep")
    for devices in (1, 2):
        done = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path), "equivalence", str(devices), variant],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
    one, two = torch.load(tmp_path / f"{variant}_1.pt"), torch.load(tmp_path / f"{variant}_2.pt")
    assert two["sharded"].startswith("FSDP") and not one["sharded"].startswith("FSDP")
    assert two["calls"]["fused_head"] > 0 and two["calls"]["packed"] > 0, two["calls"]
    assert_same_gradients(two["gradients"], one["gradients"])
    # Weights after one AdamW step: w - lr * g / (|g| + eps) (the first step's bias-corrected moments),
    # whose derivative in g is at most 1/eps; so gradients equal to FLOAT64_TOLERANCE of their scale
    # give weights equal to lr / eps times that. A shard the optimizer missed is off by lr (1e-3).
    assert one["weights"].keys() == two["weights"].keys()
    for name, weight in one["weights"].items():
        gradient = one["gradients"].get(name)
        if gradient is None:
            assert torch.equal(two["weights"][name], weight), name  # frozen (LoRA's base): untouched
            continue
        allowed = LEARNING_RATE / ADAM_EPS * FLOAT64_TOLERANCE * float(gradient.abs().max()) \
            + FLOAT64_TOLERANCE * float(weight.abs().max())
        difference = float((two["weights"][name] - weight).abs().max())
        assert difference <= allowed, f"{name}: |difference| {difference:.3g} > {allowed:.3g}"
    ranks = [torch.load(tmp_path / f"{variant}_2_collectives_{rank}.pt") for rank in (0, 1)]
    groups = ranks[0]["groups"]
    assert all(r["all_gathers"] == ranks[0]["all_gathers"] > 0 for r in ranks), "the ranks' collectives differ"
    for seen in ranks:
        passes = max(count for r in ranks for count in r["micro_batches"])  # the rank with the most, per update
        # every pass reduce-scatters every trained group once (the padding passes too): gradients sharded each time
        assert seen["reduce_scatters"] == passes * seen["trained_groups"] > 0, seen
        if variant == "uneven":  # a model deep enough that a whole-model gather shows
            assert groups == DEEP_LAYERS + 1 and seen["most_gathered"] <= MOST_GATHERED_GROUPS, seen
    if variant == "uneven":
        assert ranks[0]["micro_batches"] != ranks[1]["micro_batches"], "the run must give the ranks unequal counts"


if __name__ == "__main__":
    if sys.argv[2] == "equivalence":
        _run_equivalence(Path(sys.argv[1]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
