"""The checks ``gpu_check.py`` runs, each in a process of its own: what one GPU can show about rlcode.

Each check is a function of a ``Setup`` that returns a dict of figures (``{"skipped": why}`` where it
cannot run here). The model is random-init of a real shape (Qwen2.5-1.5B's config; weights cannot be
downloaded) with the offline tiny tokenizer (``tiny-random``: 512 ids, so prompts are short):

- ``platform``: the line ``rlcode fit`` prints (GPU, the precision and platform profile it picks
  automatically) and the versions of what the check runs on.
- ``model``: builds and saves the random model folder the other checks load.
- the rlcode / TRL pairs (``rlcode_64x512``, ``trl_64x512``, ...): ``gpu_check_pairs.py``.
- ``packed_pass``: the training pass with ``share_prefix`` (the packed pass: one decoder call per
  micro-batch, each prompt once) against the plain one under bf16 autocast: seconds per
  forward+backward and the largest log-prob difference, on the first lease's 8 rows sharing a
  ~184-token prompt, and at a training step's size (``64x512``: 8 prompts of ~200 tokens x 8
  completions of 512, one micro-batch per prompt as the Learner splits them).
- ``fp16_mixed``: GRPO steps under 16-mixed (fp16 with loss scaling: the V100 path).
- ``qlora_4bit``: GRPO steps with a 4-bit NF4 base (bitsandbytes' CUDA build) and LoRA r=16.
- ``spiral``: one SPIRAL self-play step (TicTacToe) with the HF backend.
- ``fsdp`` (several GPUs): bf16 GRPO steps with the policy sharded over every GPU (FSDP2).
- ``generation`` and ``quantized_linears``: ``gpu_check_decoding.py``.
- ``vllm`` (when ``import vllm`` works): ``gpu_vllm_smoke.py``'s checks on this model, plus sampling at
  temperature 0.7 with the vLLM backend against the trainer's ``completion_logps`` of the sampled
  tokens (mean |difference| and the importance weights the correction would use).

In a dry run the same code runs on the CPU with a 2-layer model of the same family: 16-mixed becomes
bf16-mixed there (Lightning has no fp16 autocast on CPU) and the vLLM check runs only against whatever
``vllm`` module is importable (the tests put their stand-in on the path).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder: the reward below, gpu_vllm_smoke
from gpu_measure import StepClock, free_memory, reset_peak, sync  # noqa: E402

# Qwen2.5-1.5B-Instruct's config.json (architecture fields); the dry run keeps the family, shrinks the sizes.
QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
DRY_RUN = dict(QWEN25_15B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048)
TASKS = ["Write a Python function that returns the sum of the squares of a list of integers.",
         "Write a Python function that checks whether a string is a palindrome.",
         "Write a Python function that returns the n-th Fibonacci number.",
         "Write a Python function that removes duplicate items from a list, keeping their order."]


def length_reward(prompts=None, completions=None, completion_ids=None, **columns) -> list[float]:
    """Characters / 100 (no sandbox: the check is about the GPU path, not rewards)."""
    texts = ["".join(str(m.get("content", "")) for m in c) if isinstance(c, list) else str(c) for c in completions]
    return [len(text) / 100.0 for text in texts]


@dataclass(frozen=True)
class Size:
    """One step's shape: ``prompts`` x ``generations`` rows of up to ``new_tokens``, prompts of about
    ``prompt_tokens`` (the task repeated; None: one sentence), ``steps`` GRPO steps (the first a warm-up)."""

    prompts: int
    generations: int
    new_tokens: int
    prompt_tokens: int | None
    steps: int

    @property
    def rows(self) -> int:
        return self.prompts * self.generations


# 64x512 is what a code RL step looks like (8 prompts x 8 completions, ~200-token prompts, 512 new
# tokens); 16x128 is the first lease's size, kept so its figures compare with the earlier ones. One
# timed step at 64x512 (the lease has room for no more: see gpu_check.BUDGETS_S), two at 16x128, whose
# steps varied by 40% on the first lease. The dry run keeps the shapes' roles, not their sizes.
SIZES = {"64x512": Size(8, 8, 512, 200, 2), "16x128": Size(4, 4, 128, None, 3)}
DRY_RUN_SIZES = {"64x512": Size(2, 2, 8, 40, 1), "16x128": Size(2, 2, 8, None, 1)}


def task_text(i: int, tokenizer=None, tokens: int | None = None) -> str:
    """Task ``i``; with ``tokens``, the task sentence repeated to about that many tokens (the tiny
    tokenizer's ~24 a sentence: a realistic prompt length without a data set)."""
    task = TASKS[i % len(TASKS)]
    if tokens is None:
        return task + f" (#{i})"
    repeats = max(1, round(tokens / len(tokenizer(task + " ", add_special_tokens=False)["input_ids"])))
    return " ".join([task] * repeats) + f" (#{i})"


def prompt_rows(count: int, tokenizer=None, tokens: int | None = None) -> list[dict]:
    return [{"task_id": str(i), "prompt": [{"role": "user", "content": task_text(i, tokenizer, tokens)}]}
            for i in range(count)]


class Setup:
    """What every check shares: device, sizes, the model folder."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.dry_run = args.dry_run
        self.cuda = torch.cuda.is_available() and not args.dry_run
        self.accelerator = "gpu" if self.cuda else "cpu"
        self.steps = args.steps if args.steps else (1 if args.dry_run else 4)
        self.prompts = 2 if args.dry_run else 4
        self.generations = 2 if args.dry_run else 4
        self.max_new_tokens = 8 if args.dry_run else args.max_new_tokens
        self.shape = DRY_RUN if args.dry_run else QWEN25_15B
        self.folder = model_folder(Path(args.work_dir), self.shape)
        self.steps_asked = args.steps

    def size(self, name: str) -> Size:
        """A named step shape (tiny in a dry run); ``--steps`` replaces its steps."""
        size = (DRY_RUN_SIZES if self.dry_run else SIZES)[name]
        return replace(size, steps=self.steps_asked) if self.steps_asked else size

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.folder)

    def size_rows(self, size: Size, count: int) -> list[dict]:
        """``count`` prompt rows of ``size``'s prompt length (the same on both sides of a pair)."""
        return prompt_rows(count, self.tokenizer() if size.prompt_tokens else None, size.prompt_tokens)

    def grpo(self, generations: int | None = None, **extra):
        from rlcode.modes import GRPO
        from rlcode.training.learner import Learner

        generations = generations or self.generations
        settings = dict(model_name=str(self.folder), max_new_tokens=self.max_new_tokens, temperature=1.0,
                        learning_rate=1e-6, loss_type="dapo", beta=0.0, micro_batch_size=generations,
                        generation_seed=0)
        mode = GRPO(rewards=["gpu_check_cases:length_reward"], reward_weights=None, num_generations=generations)
        return Learner(mode=mode, **{**settings, **extra})

    def fit(self, module, precision: str, datamodule=None, steps: int | None = None, devices: int = 1,
            strategy="auto", rows: list[dict] | None = None, prompts: int | None = None) -> dict:
        """Train ``steps`` steps of ``prompts`` rows each (from ``rows``, spares included: a step may not
        update); completion tokens/s after the first (warm-up) step, the largest step's peak GPU memory."""
        import lightning as L
        from torch.utils.data import DataLoader, IterableDataset

        steps, prompts = steps or self.steps, prompts or self.prompts
        rows = rows or prompt_rows(prompts * steps * 2)
        batches = [rows[i:i + prompts] for i in range(0, len(rows), prompts)]

        class Batches(IterableDataset):
            def __iter__(self):
                for batch in batches:
                    yield {key: [row[key] for row in batch] for key in batch[0]}

        clock = StepClock()
        trainer = L.Trainer(accelerator=self.accelerator, devices=devices, strategy=strategy, precision=precision,
                            max_steps=steps,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock])
        reset_peak()
        if datamodule is None:
            trainer.fit(module, train_dataloaders=DataLoader(Batches(), batch_size=None, num_workers=0))
        else:
            trainer.fit(module, datamodule=datamodule)
        result = clock.summary()  # the Learner resets CUDA's peak at each step: its per-step peaks, not peak_gb()
        result.update(optimizer_steps=trainer.global_step)
        del trainer
        free_memory()
        return result


def model_folder(work_dir: Path, shape: dict) -> Path:
    return work_dir / f"qwen2-h{shape['hidden_size']}-l{shape['num_hidden_layers']}-v{shape['vocab_size']}"


def check_platform(setup: Setup) -> dict:
    """What ``rlcode fit`` detects and picks on this machine, as its platform line, and the versions."""
    import platform as python_platform
    from importlib import metadata

    import torch

    from rlcode import platform
    from rlcode.cli.platform_profile import ProfileChoice

    info = platform.detect_platform()
    precision, kind = platform.default_precision(info), platform.profile_kind(info)
    profile = ProfileChoice(platform.PROFILE_LABELS[kind], chosen=platform.profile_for(info)) if kind else None
    line = f"platform: {info.describe()}; precision {precision} (chosen for this hardware)"
    versions = {"python": python_platform.python_version(), "cuda": torch.version.cuda}
    for name in VERSIONS_OF:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"line": line + (f"; {profile.describe()}" if profile else ""), "precision": precision,
            "profile": kind, "profile_settings": platform.profile_for(info), "versions": versions}


VERSIONS_OF = ["torch", "transformers", "huggingface-hub", "lightning", "peft", "accelerate", "numpy", "trl",
               "datasets", "bitsandbytes", "textarena", "jsonargparse", "vllm"]


def check_model(setup: Setup) -> dict:
    folder = build_model_folder(setup.folder, setup.shape)
    return {"folder": folder.name, "parameters": _parameter_count(setup.shape)}


def _parameter_count(shape: dict) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(Qwen2Config(**shape)).parameters())


def build_model_folder(folder: Path, shape: dict) -> Path:
    """A random-init Qwen2 of ``shape`` with the tiny tokenizer, saved in bf16 (what vLLM and GRPO load)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rlcode.models import resolve_model_source

    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source("tiny-random"))
    config = Qwen2Config(**shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    free_memory()
    return folder


def check_packed_pass(setup: Setup) -> dict:
    """The packed pass (``share_prefix=True``) vs the plain pass in bf16 autocast: speed and log-prob
    agreement, on the first lease's shape (top level) and at a training step's (``64x512``)."""
    import torch

    from rlcode.models import load_model, load_tokenizer

    device = torch.device("cuda" if setup.cuda else "cpu")
    policy = load_model(str(setup.folder)).to(device).train()
    tokenizer = load_tokenizer(str(setup.folder))
    generator = torch.Generator().manual_seed(0)

    def micro_batch(text: str, rows: int, length: int):  # ``rows`` completions sharing the prompt ``text``
        prompt = tokenizer([text], return_tensors="pt")["input_ids"]
        completion_ids = torch.randint(3, len(tokenizer), (rows, length), generator=generator)
        return [t.to(device) for t in (prompt.repeat(rows, 1), torch.ones_like(prompt).repeat(rows, 1),
                                       completion_ids, torch.ones_like(completion_ids))]

    first = [micro_batch(TASKS[0] * (1 if setup.dry_run else 8), 8, setup.max_new_tokens)]
    result = {"rows": 8, "prompt_tokens": first[0][0].size(1), "completion_tokens": setup.max_new_tokens,
              **_pass_against_plain(policy, first, device, warm_up=first)}
    size = setup.size("64x512")
    batches = [micro_batch(task_text(i, tokenizer, size.prompt_tokens), size.generations, size.new_tokens)
               for i in range(size.prompts)]
    result["64x512"] = {"prompts": size.prompts, "completions_per_prompt": size.generations,
                        "prompt_tokens": max(batch[0].size(1) for batch in batches),
                        "completion_tokens": size.new_tokens, "micro_batches": len(batches),
                        **_pass_against_plain(policy, batches, device, warm_up=batches[:1])}
    del policy
    free_memory()
    return result


def _pass_against_plain(policy, batches: list, device, warm_up: list) -> dict:
    """Forward+backward of every micro-batch in ``batches``, plain then packed, each after a warm-up
    on ``warm_up``: seconds of each (all micro-batches), their ratio, the largest log-prob difference."""
    import torch

    from rlcode.logprobs.sequence_logps import completion_logps

    def run(share: bool, micro_batches: list) -> tuple[float, list]:
        policy.zero_grad(set_to_none=True)
        sync()
        started, logps = time.perf_counter(), []
        for prompt_ids, prompt_mask, completion_ids, completion_mask in micro_batches:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                values = completion_logps(policy, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.7,
                                          share_prefix=share)
            values.sum().backward()
            logps.append(values.detach().float())
        sync()
        return time.perf_counter() - started, logps

    run(False, warm_up)
    run(True, warm_up)
    plain_s, plain = run(False, batches)
    packed_s, packed = run(True, batches)
    policy.zero_grad(set_to_none=True)
    difference = max(float((a - b).abs().max()) for a, b in zip(packed, plain))
    return {"plain_s": round(plain_s, 4), "packed_s": round(packed_s, 4), "speedup": round(plain_s / packed_s, 2),
            "max_abs_logp_difference": difference}

def check_fp16_mixed(setup: Setup) -> dict:
    precision = "16-mixed" if setup.cuda else "bf16-mixed"  # Lightning: no fp16 autocast on CPU
    return {"precision": precision, **setup.fit(setup.grpo(precision=precision), precision)}


def check_qlora(setup: Setup) -> dict:
    precision = "bf16-mixed"
    module = setup.grpo(precision=precision, quantization="4bit", lora={"r": 16})
    return setup.fit(module, precision)


def check_spiral(setup: Setup) -> dict:
    from rlcode.data.games import GameDataModule
    from rlcode.modes import SPIRAL
    from rlcode.training.learner import Learner

    module = Learner(mode=SPIRAL(opponent="self", move_format="bracket", max_turns=4), model_name=str(setup.folder),
                    max_new_tokens=setup.max_new_tokens, temperature=1.0, micro_batch_size=8, loss_type="dr_grpo",
                    beta=0.0, precision="bf16-mixed")
    return setup.fit(module, "bf16-mixed", datamodule=GameDataModule(episodes_per_step=2, eval_episodes=1), steps=1)


def check_fsdp(setup: Setup) -> dict:
    """bf16 GRPO steps with the policy sharded over every GPU (``--trainer.strategy fsdp``): tokens/s and
    rank 0's peak memory. A dry run shards over 2 CPU processes (gloo)."""
    import torch

    from rlcode.training.fsdp_strategy import FSDP2Strategy

    devices = torch.cuda.device_count() if setup.cuda else 2
    if devices < 2:
        return {"skipped": "one GPU: FSDP shards over several (this line is for multi-GPU machines)"}
    return {"devices": devices, **setup.fit(setup.grpo(precision="bf16-mixed"), "bf16-mixed", devices=devices,
                                            strategy=FSDP2Strategy())}


def check_vllm(setup: Setup) -> dict:
    """gpu_vllm_smoke's checks, then vLLM samples at T=0.7 scored by the trainer."""
    import torch

    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"skipped": "vllm is not importable"}
    result = {}
    if setup.cuda:  # its own process: one vLLM engine (and torch.distributed world) per process
        import subprocess

        smoke = subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_vllm_smoke.py")), "--model",
                                str(setup.folder), "--prompts", "4", "--generations", "4", "--max-new-tokens", "64"],
                               capture_output=True, text=True, timeout=1800)
        result["smoke_exit_code"] = smoke.returncode
        result["smoke_output"] = (smoke.stdout + smoke.stderr)[-2000:]
    else:
        result["smoke"] = "needs CUDA: not run"
    from rlcode.logprobs.sequence_logps import completion_logps
    from rlcode.models import load_model, load_tokenizer
    from rlcode.rollout import SamplingParams, render_prompt
    from rlcode.rollout.vllm.backend import VLLMBackend
    from rlcode.rollout.vllm.engine import VLLMSettings

    device = torch.device("cuda" if setup.cuda else "cpu")
    policy = load_model(str(setup.folder), precision="bf16-true").to(device).eval()
    tokenizer = load_tokenizer(str(setup.folder))
    backend = VLLMBackend(policy, tokenizer, str(setup.folder), settings=VLLMSettings(max_model_len=1024), seed=0)
    prompts = [render_prompt(tokenizer, row["prompt"], chat=True) for row in prompt_rows(setup.prompts)]
    rollout = backend.generate(prompts, setup.generations, SamplingParams(temperature=0.7, seed=1,
                                                                          max_new_tokens=setup.max_new_tokens))
    with torch.no_grad():
        trainer = completion_logps(policy, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                   rollout.completion_mask, 0.7)
    mask = rollout.completion_mask.bool()
    difference = (trainer.float() - rollout.sampling_logps.to(trainer.device))[mask]
    weights = difference.exp().clamp(max=3.0)
    result.update(tokens=int(mask.sum()), mean_abs_logp_difference=float(difference.abs().mean()),
                  importance_weight_mean=float(weights.mean()), importance_weight_min=float(weights.min()))
    del backend, policy
    free_memory()
    return result


CHECKS = {"platform": check_platform, "model": check_model, "packed_pass": check_packed_pass,
          "fp16_mixed": check_fp16_mixed, "qlora_4bit": check_qlora, "spiral": check_spiral, "fsdp": check_fsdp,
          "vllm": check_vllm}
NEEDS_NO_MODEL = {"platform", "model"}
