"""Key names of the training scripts rlcode replaces, mapped to rlcode's own.

Users of those scripts type their keys (``model.id``, ``evaluation.eval_interval_steps``,
``--num-steps``), and the spelling-based "did you mean" then points at an unrelated setting
(``model.id`` -> ``model.mode``). ``rlcode.cli.errors`` asks ``seed_hint`` first: a name of the
table gets its rlcode key, or, for a name with no setting here, what to do instead.

The table, as the docs show it, is ``markdown_table()``.
"""

from __future__ import annotations

NOT_A_SETTING = "not a setting"

# The scripts' name (section.key as their configs nest it, or a flag's name with "_" for "-")
# -> rlcode's key, or "not a setting: what to do".
SEED_NAMES: dict[str, str] = {
    "model.id": "model.model_name",
    "model.cache_dir": f"{NOT_A_SETTING}: models are cached by Hugging Face; set HF_HOME to move the cache, "
                       "or give model.model_name a local folder",
    "model": "model.model_name",  # the multi-step script's --model NAME
    "training_args.learning_rate": "model.learning_rate",
    "learning_rate": "model.learning_rate",
    "training_args.per_device_train_batch_size": "data.prompts_per_step",
    "batch_size": "data.prompts_per_step",
    "training_args.max_steps": "trainer.max_steps",
    "num_steps": "trainer.max_steps",
    "training_args.num_generations": "model.mode.num_generations",
    "evaluation.enabled": f"{NOT_A_SETTING}: the MBPP eval runs unless eval.at_start and eval.at_end are false "
                          "and eval.every_n_steps is 0",
    "evaluation.num_questions": "eval.num_questions",
    "evaluation.eval_interval_steps": "eval.every_n_steps",
    "evaluation.temperature": "eval.temperature",
    "evaluation.timeout_seconds": "eval.timeout",
    "vllm.enabled": "model.rollout_backend",
    "vllm.gpu_memory_utilization": "model.vllm.gpu_memory_utilization",
    "vllm.max_model_len": "model.vllm.max_model_len",
    "project": "run.wandb_project",
    "max_attempts": "model.mode.max_attempts",
    "dataset_split": "data.train_split",
    "dataset_limit": "data.num_train_tasks",
    "dry_run": "model.dry_run",
    "use_openai": "model.rollout_backend",
}

# Names that are unambiguous without their section (``--model.cache_dir``, ``eval.eval_interval_steps``).
_BY_LAST_NAME = {name.rsplit(".", 1)[-1]: target for name, target in SEED_NAMES.items()
                 if "." in name and name.rsplit(".", 1)[-1] in
                 ("id", "cache_dir", "per_device_train_batch_size", "eval_interval_steps", "timeout_seconds",
                  "num_questions", "gpu_memory_utilization", "max_model_len")}
_VALUES = {"vllm.enabled": "vllm", "use_openai": "openai"}  # settings that became a choice of one key


def seed_target(key: str) -> str | None:
    """rlcode's key (or "not a setting: ...") for a key of the old scripts, None when it is none of them."""
    name = key.lstrip("-").replace("-", "_")
    for prefix in ("model.init_args.", "init_args."):  # the parser may report it under init_args
        name = name.replace(prefix, "")
    if name in SEED_NAMES:
        return SEED_NAMES[name]
    return _BY_LAST_NAME.get(name.rsplit(".", 1)[-1])


def seed_hint(key: str, flag: bool) -> str:
    """``"did you mean --model.model_name? "``, ``"cache_dir is not a setting: ... "`` or ``""``."""
    target = seed_target(key)
    if target is None:
        return ""
    if target.startswith(NOT_A_SETTING):  # the first line already says "not a setting": what to do
        advice = target.split(": ", 1)[1]
        return f"{advice[0].upper()}{advice[1:]}. "
    name = key.lstrip("-").replace("-", "_")
    value = next((v for old, v in _VALUES.items() if name.endswith(old)), None)
    written = f"{'--' if flag else ''}{target}{f' {value}' if value else ''}"
    return f"did you mean {written}? "


def markdown_table() -> str:
    """The table for the docs: the old scripts' names and rlcode's."""
    rows = [f"| `{name}` | {_cell(target)} |" for name, target in SEED_NAMES.items()]
    return "\n".join(["| Old scripts' key | rlcode |", "|---|---|", *rows])


def _cell(target: str) -> str:
    return target if target.startswith(NOT_A_SETTING) else f"`{target}`"
