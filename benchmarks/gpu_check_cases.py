"""The checks ``gpu_check.py`` runs, each in a process of its own: what one GPU can show about rlcode.

Each check is a function of a ``Setup`` that returns a dict of figures (``{"skipped": why}`` where it
cannot run here). The model is random-init of a real shape (Qwen2.5-1.5B's config; weights cannot be
downloaded) with the offline tiny tokenizer (``tiny-random``: 512 ids, so prompts are short):

- ``platform``: the line ``rlcode fit`` prints (GPU, the precision and platform profile it picks
  automatically) and the versions of what the check runs on.
- ``model``: builds and saves the random model folder the other checks load.
- ``grpo_bf16`` / ``trl_bf16``: bf16-mixed GRPO steps with the HF backend, rlcode and TRL's
  GRPOTrainer on the same prompts, G, lengths, length reward, loss and micro-batches: completion
  tokens/s after a warm-up step and peak GPU memory (the P5 figure compares the two).
- ``shared_prefix``: the shared-prefix training pass against the plain one under bf16 autocast on G
  rows sharing a prompt: seconds per forward+backward and the largest log-prob difference.
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
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder: the reward below, gpu_vllm_smoke
from gpu_measure import StepClock, free_memory, peak_gb, reset_peak, sync, throughput  # noqa: E402

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


def prompt_rows(count: int) -> list[dict]:
    return [{"task_id": str(i), "prompt": [{"role": "user", "content": TASKS[i % len(TASKS)] + f" (#{i})"}]}
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

    def grpo(self, **extra):
        from rlcode.modes import GRPO
        from rlcode.training.learner import Learner

        settings = dict(model_name=str(self.folder), max_new_tokens=self.max_new_tokens, temperature=1.0,
                        learning_rate=1e-6, loss_type="dapo", beta=0.0, micro_batch_size=self.generations,
                        generation_seed=0)
        mode = GRPO(rewards=["gpu_check_cases:length_reward"], reward_weights=None, num_generations=self.generations)
        return Learner(mode=mode, **{**settings, **extra})

    def fit(self, module, precision: str, datamodule=None, steps: int | None = None, devices: int = 1,
            strategy="auto") -> dict:
        """Train ``steps`` steps; completion tokens/s after the first (warm-up) step, peak GPU memory."""
        import lightning as L
        import torch
        from torch.utils.data import DataLoader, IterableDataset

        steps = steps or self.steps
        rows = prompt_rows(self.prompts * steps * 2)
        batches = [rows[i:i + self.prompts] for i in range(0, len(rows), self.prompts)]

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
        result = clock.summary()
        result.update(peak_gpu_gb=peak_gb(), optimizer_steps=trainer.global_step)
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
    from rlcode.platform_profile import ProfileChoice

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


def check_grpo_bf16(setup: Setup) -> dict:
    return setup.fit(setup.grpo(precision="bf16-mixed"), "bf16-mixed")


def check_trl_bf16(setup: Setup) -> dict:
    """TRL 1.16's GRPOTrainer configured like the rlcode side (bf16, same prompts, G, lengths, reward, loss)."""
    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as error:
        return {"skipped": f"TRL is not importable ({error})"}
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    tokenizer = AutoTokenizer.from_pretrained(setup.folder)
    model = AutoModelForCausalLM.from_pretrained(setup.folder, dtype=torch.float32)
    times, tokens = [], []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

    def reward(prompts=None, completions=None, completion_ids=None, **columns):
        tokens.append(sum(len(ids) for ids in completion_ids))
        return length_reward(completions=completions)

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="gpu-check-trl-"), use_cpu=not setup.cuda, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0,
        per_device_train_batch_size=setup.generations, gradient_accumulation_steps=setup.prompts,
        num_generations=setup.generations, max_completion_length=setup.max_new_tokens, temperature=1.0, top_k=0,
        top_p=1.0, beta=0.0, loss_type="dapo", bf16=True, learning_rate=1e-6, max_steps=setup.steps,
        shuffle_dataset=False,
        gradient_checkpointing=False)  # TRL's default is on; rlcode's GRPO check runs without (as step_throughput's sides)
    reset_peak()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(prompt_rows(setup.prompts * setup.steps)), callbacks=[Clock()])
    trainer.train()
    result = dict(throughput(times, tokens), peak_gpu_gb=peak_gb(), optimizer_steps=trainer.state.global_step)
    del trainer, model
    free_memory()
    return result


def check_shared_prefix(setup: Setup) -> dict:
    """Shared-prefix vs plain training pass in bf16 autocast: speed and log-prob agreement."""
    import torch

    from rlcode.logprobs.sequence_logps import completion_logps
    from rlcode.models import load_model, load_tokenizer

    device = torch.device("cuda" if setup.cuda else "cpu")
    policy = load_model(str(setup.folder)).to(device).train()
    tokenizer = load_tokenizer(str(setup.folder))
    rows = 8
    prompt = tokenizer([TASKS[0] * (1 if setup.dry_run else 8)], return_tensors="pt")["input_ids"].to(device)
    prompt_ids, prompt_mask = prompt.repeat(rows, 1), torch.ones_like(prompt).repeat(rows, 1)
    generator = torch.Generator().manual_seed(0)
    length = setup.max_new_tokens
    completion_ids = torch.randint(3, len(tokenizer), (rows, length), generator=generator).to(device)
    completion_mask = torch.ones_like(completion_ids)
    result = {"rows": rows, "prompt_tokens": prompt.size(1), "completion_tokens": length}
    logps = {}
    for share in (False, True, False, True):  # alternate; the second of each is timed
        policy.zero_grad(set_to_none=True)
        sync()
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            values = completion_logps(policy, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.7,
                                      share_prefix=share)
        values.sum().backward()
        sync()
        result[f"{'shared' if share else 'plain'}_s"] = round(time.perf_counter() - started, 4)
        logps[share] = values.detach().float()
    result["max_abs_logp_difference"] = float((logps[True] - logps[False]).abs().max())
    result["speedup"] = round(result["plain_s"] / result["shared_s"], 2)
    del policy
    free_memory()
    return result


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


CHECKS = {"platform": check_platform, "model": check_model, "grpo_bf16": check_grpo_bf16,
          "trl_bf16": check_trl_bf16, "fp16_mixed": check_fp16_mixed, "qlora_4bit": check_qlora,
          "shared_prefix": check_shared_prefix, "spiral": check_spiral, "fsdp": check_fsdp, "vllm": check_vllm}
NEEDS_NO_MODEL = {"platform", "model"}
