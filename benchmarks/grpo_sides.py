"""The two sides of the step-throughput benchmark: rlcode's GRPO module and TRL's GRPOTrainer.

Each side runs in a fresh interpreter (``step_throughput.py`` starts it), trains ``steps`` GRPO
steps on the same model, prompts, group size, lengths and reward, and returns one JSON-able dict:
per-step wall times, completion tokens per step, generation seconds per step, peak RSS. The first
step is the warm-up; the parent leaves it out of tokens/s.

What is the same on both sides (and why):
  - prompts: MBPP train tasks in order as chat messages, each side renders them with the
    tokenizer's chat template; TRL's shuffle is off so both see the same prompts per step;
  - 4 prompts x G completions per step, one optimizer step per batch (TRL: per-device batch 4 x
    gradient accumulation 4 = one generation batch of 16, so no old log-probs on either side);
  - loss micro-batches of 4 completions (TRL's per-device batch), AdamW, lr, grad-norm clip 1.0;
  - fp32 weights, no autocast (TRL's bf16 default would turn autocast on: off for parity), no
    gradient checkpointing, temperature 1.0, no top-k / top-p, EOS as the only stop;
  - the reward: completion length in characters / 100 (cheap, so the sandbox does not dominate,
    and it varies within every group, so every step updates), or rlcode's execution reward.
"""

from __future__ import annotations

import os
from pathlib import Path
import resource
import time
from dataclasses import asdict, dataclass

# used when MBPP_DATASET_PATH is unset: the shared copy beside the repository
DEFAULT_MBPP = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp" / "mbpp.jsonl")

# The engine both sides build with --backend vllm: float32 like the policy, the same KV cache size.
VLLM_ENGINE = {"dtype": "float32", "kv_cache_gib": 1.0, "max_model_len": 1024}

# Token counts of the TRL side, appended by the reward (the one place TRL hands out completion ids).
_TRL_TOKENS_PER_CALL: list[int] = []


@dataclass
class Settings:
    """One benchmark configuration, identical for both sides."""

    model: str = "tiny-random"
    steps: int = 4
    beta: float = 0.0
    prompts_per_step: int = 4
    num_generations: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    micro_batch_size: int = 4
    learning_rate: float = 1e-6
    reward: str = "length"  # "length" or "execution"
    threads: int = 2
    seed: int = 0
    share_prefix: bool = True  # rlcode only: TRL has no shared-prefix pass
    rollout_precision: str = "same"  # rlcode only: "int8" samples from an int8 copy (TRL samples in fp32)
    backend: str = "hf"  # rlcode's rollout backend; "vllm": a colocated engine in float32 (its CPU build here)
    trl_vllm: bool = False  # TRL samples with its colocated vLLM too (with backend "vllm")

    def as_dict(self) -> dict:
        return asdict(self)


def completion_length_reward(prompts=None, completions=None, completion_ids=None, **columns) -> list[float]:
    """Characters / 100. TRL passes conversational completions as message lists and token ids."""
    if completion_ids is not None:
        _TRL_TOKENS_PER_CALL.append(sum(len(ids) for ids in completion_ids))
    return [len(_text(c)) / 100.0 for c in completions]


def _text(completion) -> str:
    if isinstance(completion, list):  # [{"role": "assistant", "content": ...}]
        return "".join(str(message.get("content", "")) for message in completion)
    return str(completion)


def prompt_rows(count: int) -> list[dict]:
    """The first ``count`` MBPP train tasks as chat messages plus the columns rewards read."""
    from rlcode.data.mbpp import load_mbpp
    from rlcode.data.prompts import chat_messages

    tasks = load_mbpp(os.environ.get("MBPP_DATASET_PATH", DEFAULT_MBPP), split="train")
    if len(tasks) < count:
        raise ValueError(f"only {len(tasks)} MBPP train tasks for {count} prompts: lower --steps")
    return [{"task_id": t.task_id, "prompt": chat_messages(t), "test_list": list(t.test_list),
             "test_setup_code": t.test_setup_code, "entry_point": t.entry_point} for t in tasks[:count]]


class TokenCounter:
    """Real (unpadded) token positions the decoder ran, with gradients (training) and without
    (generation, reference / old log-probs): a forward pre-hook on the decoder body, which every
    call goes through (plain, shared-prefix and generation passes, on both sides)."""

    def __init__(self, causal_lm) -> None:
        import torch

        self.trained = 0
        self.inference = 0
        self.parameters = flop_parameters(causal_lm)
        self.shapes = (causal_lm.config.hidden_size, causal_lm.config.intermediate_size)

        def count(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                return
            mask = kwargs.get("attention_mask")
            real = int(mask[:, -ids.size(1):].sum()) if mask is not None and mask.dim() == 2 else ids.numel()
            if torch.is_grad_enabled():
                self.trained += real
            else:
                self.inference += real

        causal_lm.get_decoder().register_forward_pre_hook(count, with_kwargs=True)

    def as_dict(self) -> dict:
        return {"trained_tokens": self.trained, "inference_tokens": self.inference, "parameters": self.parameters,
                "model_flops": 6 * self.parameters * self.trained + 2 * self.parameters * self.inference,
                "matmul_flops_per_s": matmul_flops_per_s(*self.shapes)}


def flop_parameters(causal_lm) -> int:
    """Parameters a token's forward multiplies by: all but an untied input embedding (a lookup)."""
    embedding = causal_lm.get_input_embeddings().weight
    head = causal_lm.get_output_embeddings().weight
    total = sum(p.numel() for p in causal_lm.parameters())
    return total if embedding is head else total - embedding.numel()


def matmul_flops_per_s(hidden: int, intermediate: int, tokens: int = 1024, seconds: float = 3.0) -> float:
    """This process's fp32 matmul throughput on the model's MLP shapes ([tokens, H] x [H, I]), same
    threads as the side: the machine's ceiling that utilisation is measured against (best of runs)."""
    import torch

    a, b = torch.randn(tokens, hidden), torch.randn(hidden, intermediate)
    torch.mm(a, b)  # warm-up
    best, started = 0.0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        tick = time.perf_counter()
        for _ in range(5):
            torch.mm(a, b)
        best = max(best, 5 * 2 * tokens * hidden * intermediate / (time.perf_counter() - tick))
    return best


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)


# ---- rlcode ------------------------------------------------------------------------------------
def run_rlcode(settings: Settings) -> dict:
    """``settings.steps`` training steps of rlcode's GRPO module under a plain Lightning Trainer."""
    _set_threads(settings.threads)
    import lightning as L
    from torch.utils.data import DataLoader, IterableDataset

    from rlcode.modes import GRPO
    from rlcode.training.learner import Learner
    from rlcode.training.run_context import SandboxSettings

    rows = prompt_rows(settings.prompts_per_step * settings.steps * 2)  # spare batches: a step may not update
    batches = [rows[i:i + settings.prompts_per_step] for i in range(0, len(rows), settings.prompts_per_step)]

    class Batches(IterableDataset):
        def __iter__(self):
            for batch in batches:
                yield {key: [row[key] for row in batch] for key in batch[0]}

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.tokens: list[int] = []
            self.generation: list[float] = []
            self.phases: list[dict] = []

        def on_train_start(self, trainer, module) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer, module, *args) -> None:
            record = module.last_step
            self.ends.append(time.perf_counter())
            self.tokens.append(sum(record.completion_lengths))
            self.generation.append(record.timings.get("generation", 0.0))
            self.phases.append({k: round(v, 3) for k, v in record.timings.items()})

    reward = "execution" if settings.reward == "execution" else "grpo_sides:completion_length_reward"
    loaded = time.perf_counter()
    mode = GRPO(rewards=[reward], reward_timeout=5.0, sandbox=SandboxSettings(workers=settings.threads),
                num_generations=settings.num_generations)
    module = Learner(mode=mode, model_name=settings.model, max_new_tokens=settings.max_new_tokens,
                  temperature=settings.temperature, learning_rate=settings.learning_rate, loss_type="dapo",
                  beta=settings.beta, micro_batch_size=settings.micro_batch_size, max_grad_norm=1.0,
                  generation_seed=settings.seed, share_prefix=settings.share_prefix,
                  rollout_precision=settings.rollout_precision, rollout_backend=settings.backend,
                  vllm=VLLM_ENGINE if settings.backend == "vllm" else None)
    clock = StepClock()
    counters = []

    class CountTokens(L.Callback):
        def on_train_batch_start(self, trainer, module, *args) -> None:
            if not counters:  # the model exists from configure_model on
                counters.append(TokenCounter(module.policy))
            if len(clock.ends) == 1:  # the warm-up step is left out, as in tokens/s
                counters[0].trained = counters[0].inference = 0

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=settings.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[clock, CountTokens()])
    trainer.fit(module, train_dataloaders=DataLoader(Batches(), batch_size=None, num_workers=0))
    steps = [b - a for a, b in zip([clock.started] + clock.ends[:-1], clock.ends)]
    return {"side": "rlcode", "step_s": steps, "tokens": clock.tokens, "generation_s": clock.generation,
            "phases": clock.phases, "optimizer_steps": trainer.global_step,
            "setup_s": clock.started - loaded, "peak_rss_mb": peak_rss_mb(), **counters[0].as_dict()}


# ---- TRL ---------------------------------------------------------------------------------------
def run_trl(settings: Settings) -> dict:
    """``settings.steps`` optimizer steps of TRL's GRPOTrainer, configured like the rlcode side."""
    _set_threads(settings.threads)
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlcode.models import resolve_model_source

    folder = resolve_model_source(settings.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    dataset = Dataset.from_list(prompt_rows(settings.prompts_per_step * settings.steps))

    generation_s: list[float] = []
    original_generate = GRPOTrainer._generate

    def timed_generate(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return original_generate(self, *args, **kwargs)
        finally:
            generation_s.append(time.perf_counter() - started)

    GRPOTrainer._generate = timed_generate

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())
            if len(self.ends) == 1:  # the warm-up step is left out, as in tokens/s
                counter.trained = counter.inference = 0

    if settings.reward == "execution":
        from rlcode.rewards import ExecutionReward

        execution = ExecutionReward(timeout=5.0, workers=settings.threads)

        def execution_reward(prompts=None, completions=None, completion_ids=None, **columns):
            _TRL_TOKENS_PER_CALL.append(sum(len(ids) for ids in completion_ids))
            return execution(prompts=prompts, completions=completions, **columns)

        reward_funcs = [execution_reward]
    else:
        reward_funcs = [completion_length_reward]

    group = settings.num_generations
    per_device = settings.micro_batch_size
    generation_batch = settings.prompts_per_step * group
    if generation_batch % per_device:
        raise ValueError(f"{generation_batch} completions per step do not split into micro-batches of {per_device}")
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), use_cpu=True, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, seed=settings.seed, dataloader_num_workers=0,
        per_device_train_batch_size=per_device, gradient_accumulation_steps=generation_batch // per_device,
        num_generations=group, max_completion_length=settings.max_new_tokens, temperature=settings.temperature,
        top_k=0, top_p=1.0, beta=settings.beta, loss_type="dapo", bf16=False, gradient_checkpointing=False,
        learning_rate=settings.learning_rate, max_grad_norm=1.0, max_steps=settings.steps, shuffle_dataset=False,
        **(_trl_vllm() if settings.backend == "vllm" and settings.trl_vllm else {}),
    )
    clock = StepClock()
    counter = TokenCounter(model)
    loaded = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    steps = [b - a for a, b in zip([clock.started] + clock.ends[:-1], clock.ends)]
    return {"side": "trl", "step_s": steps, "tokens": list(_TRL_TOKENS_PER_CALL), "generation_s": generation_s,
            "optimizer_steps": trainer.state.global_step, "setup_s": clock.started - loaded,
            "peak_rss_mb": peak_rss_mb(), **counter.as_dict()}


def _trl_vllm() -> dict:
    """TRL's colocated vLLM with the engine rlcode's side builds (TRL has no KV-size or dtype keyword:
    its vllm_model_impl and its model's dtype decide; the cache by share)."""
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": VLLM_ENGINE["max_model_len"],
            "vllm_gpu_memory_utilization": 0.3, "vllm_enable_sleep_mode": False}


def run_vllm_generate(settings: Settings) -> dict:
    """vLLM's own ``LLM.generate`` on the same prompts and sampling, no trainer: the sampling floor the
    rlcode side's generation stands against (``generation_s`` = ``step_s``; no update)."""
    _set_threads(settings.threads)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its memory in this RSS
    import vllm
    from transformers import AutoTokenizer

    from rlcode.models import resolve_model_source

    folder = resolve_model_source(settings.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = prompt_rows(settings.prompts_per_step * settings.steps)
    texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True) for row in rows]
    loaded = time.perf_counter()
    llm = vllm.LLM(model=folder, seed=settings.seed, dtype=VLLM_ENGINE["dtype"], max_model_len=VLLM_ENGINE["max_model_len"],
                   kv_cache_memory_bytes=int(VLLM_ENGINE["kv_cache_gib"] * 2**30))
    params = vllm.SamplingParams(n=settings.num_generations, temperature=settings.temperature, top_p=1.0,
                                 max_tokens=settings.max_new_tokens, seed=settings.seed)
    started = time.perf_counter()
    step_s, tokens = [], []
    for step in range(settings.steps):
        batch = texts[step * settings.prompts_per_step:(step + 1) * settings.prompts_per_step]
        begun = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        step_s.append(time.perf_counter() - begun)
        tokens.append(sum(len(sample.token_ids) for output in outputs for sample in output.outputs))
    return {"side": "vllm_generate", "step_s": step_s, "tokens": tokens, "generation_s": step_s,
            "optimizer_steps": 0, "setup_s": started - loaded, "peak_rss_mb": peak_rss_mb(),
            "trained": 0, "inference": 0, "model_flops": 0.0, "trained_tokens": 0, "matmul_flops_per_s": 1.0}


SIDES = {"rlcode": run_rlcode, "trl": run_trl, "vllm_generate": run_vllm_generate}
