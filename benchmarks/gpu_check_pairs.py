"""The GPU check's rlcode / TRL pairs: GRPO steps of rlcode's Learner and of TRL's GRPOTrainer with the
same settings, in the same call, each side a check (a process) of its own, named ``<side>_<pair>``.

A pair is a size and a setting:

- sizes (``gpu_check_cases.SIZES``): ``64x512``, 64 rows (8 prompts x 8 completions) of up to 512 new
  tokens after ~200-token prompts, what a code RL step looks like; ``16x128``, 16 rows (4 x 4) of up to
  128 after one-sentence prompts, the first lease's size (its figures compare with that lease's).
- settings: a full fine-tune with gradient checkpointing off on both sides (no suffix), the same with
  it on on both (``_ckpt``), and LoRA r=16 through peft on both (``_lora``: rlcode's ``LoraSettings``
  defaults, alpha 32, no dropout, every linear layer but the head, and the same ``LoraConfig`` for TRL).

Shared by both sides: the random model folder, bf16 autocast over fp32 weights, the same prompts in
the same order, G, the length limit, sampling at T 1 without top-k / top-p, the length reward, the
DAPO loss, beta 0, lr 1e-6, grad-norm clip 1.0, one optimizer step per step (TRL: G rows per device
batch x one accumulation step per prompt, so no old log-probs on either side) and micro-batches of G
rows. What differs is each library's own way: rlcode's packed pass and decoding loop, TRL's plain pass,
``generate()`` and default fused AdamW.

Each side records completion tokens/s after its warm-up step and the largest step's peak GPU memory
(``gpu_measure``: both per step, since rlcode's Learner resets CUDA's peak at each step's start);
``gpu_check.p5_figure`` divides rlcode's by TRL's for every pair whose two sides ran in the call.
"""

from __future__ import annotations

import tempfile
import time
from functools import partial

from gpu_check_cases import Setup, Size, length_reward
from gpu_measure import PeakPerStep, free_memory, reset_peak, step_peaks, throughput

# The most telling first: a lease that runs out of time still has them (gpu_check.BUDGETS_S runs in this order).
PAIRS = ["64x512", "64x512_lora", "64x512_ckpt", "16x128"]
LORA_R = 16


def pair_settings(pair: str) -> dict:
    """``{"size", "lora", "gradient_checkpointing"}`` of a pair's name."""
    size, _, setting = pair.partition("_")
    return {"size": size, "lora": setting == "lora", "gradient_checkpointing": setting == "ckpt"}


def _describe(setup: Setup, side: str, pair: str, size: Size, settings: dict) -> dict:
    from rlcode.rollout import render_prompt

    tokenizer = setup.tokenizer()
    rendered = [render_prompt(tokenizer, row["prompt"], chat=True) for row in setup.size_rows(size, size.prompts)]
    prompt_tokens = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered]
    return {"side": side, "pair": pair, "rows": size.rows, "prompts": size.prompts, "new_tokens": size.new_tokens,
            "prompt_tokens": round(sum(prompt_tokens) / len(prompt_tokens)), "steps": size.steps,
            "gradient_checkpointing": settings["gradient_checkpointing"],
            "lora_r": LORA_R if settings["lora"] else None}


def rlcode_side(pair: str, setup: Setup) -> dict:
    """rlcode's Learner under Lightning, bf16-mixed, HF backend."""
    settings = pair_settings(pair)
    size = setup.size(settings["size"])
    module = setup.grpo(generations=size.generations, max_new_tokens=size.new_tokens, precision="bf16-mixed",
                        gradient_checkpointing=settings["gradient_checkpointing"],
                        lora={"r": LORA_R} if settings["lora"] else None)
    description = _describe(setup, "rlcode", pair, size, settings)
    result = setup.fit(module, "bf16-mixed", steps=size.steps, prompts=size.prompts,
                       rows=setup.size_rows(size, size.prompts * size.steps * 2))
    return {**description, "trained_parameters": _trained(module.policy), **result}


def trl_side(pair: str, setup: Setup) -> dict:
    """TRL's GRPOTrainer configured like the rlcode side of the same pair."""
    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as error:
        return {"skipped": f"TRL is not importable ({error})"}
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    settings = pair_settings(pair)
    size = setup.size(settings["size"])
    description = _describe(setup, "trl", pair, size, settings)
    tokenizer = setup.tokenizer()
    model = AutoModelForCausalLM.from_pretrained(setup.folder, dtype=torch.float32)
    times, tokens = [], []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

    def reward(prompts=None, completions=None, completion_ids=None, **columns):  # once per generation batch
        tokens.append(sum(len(ids) for ids in completion_ids))
        return length_reward(completions=completions)

    checkpointing = settings["gradient_checkpointing"]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="gpu-check-trl-"), use_cpu=not setup.cuda, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, dataloader_num_workers=0,
        per_device_train_batch_size=size.generations, gradient_accumulation_steps=size.prompts,
        num_generations=size.generations, max_completion_length=size.new_tokens, temperature=1.0, top_k=0,
        top_p=1.0, beta=0.0, loss_type="dapo", bf16=True, learning_rate=1e-6, max_grad_norm=1.0,
        max_steps=size.steps, shuffle_dataset=False,
        # TRL's default is on: set either way, as the rlcode side (rlcode's checkpointing is non-reentrant)
        gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None)
    peaks = PeakPerStep()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(setup.size_rows(size, size.prompts * size.steps)),
                          callbacks=[Clock(), peaks], peft_config=_peft_config() if settings["lora"] else None)
    reset_peak()
    trainer.train()
    result = dict(description, trained_parameters=_trained(trainer.model), **throughput(times, tokens),
                  **step_peaks(peaks.peaks), optimizer_steps=trainer.state.global_step)
    del trainer, model
    free_memory()
    return result


def _trained(model) -> int:
    """Parameters with gradients: equal on both sides when they train the same weights (LoRA or all)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _peft_config():
    """peft's LoraConfig as rlcode's ``apply_lora`` builds it from ``LoraSettings(r=LORA_R)``."""
    from peft import LoraConfig

    from rlcode.models.adapters import LoraSettings

    lora = LoraSettings(r=LORA_R)
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules,
                      task_type="CAUSAL_LM")


CHECKS = {f"{side}_{pair}": partial(run, pair) for pair in PAIRS for side, run in (("rlcode", rlcode_side),
                                                                                  ("trl", trl_side))}
NEEDS_NO_MODEL: set = set()
