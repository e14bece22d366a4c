"""The detected GPU's profile (``rlcode.platform.profile_for``) applied to what the user leaves unset.

The same rule as the precision: a key set in any ``--config`` file or on the command line is kept,
however it compares with the profile. Which keys the user set is read from a first parse without
defaults; the profile's other keys are then appended to the command line as ``--key=value``, so the
real parse types and validates them like the user's own arguments and ``--print_config`` shows them.
``--run.platform_profile off`` applies none; ``--run.platform_profile h100x4`` (a kind, optionally with a
GPU count) applies that GPU's profile and precision wherever it runs: with ``--print_config``, a login
node without GPUs shows what a job on those GPUs would get.

On several GPUs the profile also picks ``trainer.strategy``: FSDP when one copy of the model's training
state (from its parameter count, read off its config on the meta device) does not fit in a share of
one GPU, DDP otherwise (``rlcode.platform.sharding_choice``); the platform line says which and why.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from jsonargparse import Namespace

import rlcode.platform as platform
from rlcode.training.fsdp_strategy import STRATEGY_WORDS

_SWITCH = "run.platform_profile"


@dataclass
class ProfileChoice:
    """What the profile chose (``chosen``) and which of its keys the user's configs set (``kept``)."""

    label: str
    chosen: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)
    switched_off: bool = False
    reasons: dict = field(default_factory=dict)  # why a chosen value (the strategy's sizes)
    previewed: platform.PlatformInfo | None = None  # the GPU named by run.platform_profile, when one is

    def describe(self) -> str:
        """The platform line's part about the profile: every chosen value and how to override it."""
        if self.switched_off:
            return f"{self.label} profile off ({_SWITCH} off)"
        chosen = ", ".join(f"{key}={_text(value)}" + (f" ({self.reasons[key]})" if key in self.reasons else "")
                           for key, value in self.chosen.items()) or "nothing"
        text = f"{self.label} profile: {chosen}"
        if self.kept:
            text += "; from the config: " + ", ".join(f"{key}={_text(value)}" for key, value in self.kept.items())
        return text + f" (override one with --KEY VALUE or in a config; all with --{_SWITCH} off)"


def with_profile(parser, args) -> tuple[list[str] | dict | Namespace | None, ProfileChoice | None]:
    """``args`` with the detected GPU's profile appended for the keys the user does not set.

    Returns the arguments to parse and what was chosen (None on CPU, or when the arguments are a
    dict or Namespace given from Python: the profile is for command lines and config files).
    """
    if isinstance(args, (dict, Namespace)):
        return args, None
    argv = list(sys.argv[1:] if args is None else args)
    info, previewed = platform.detect_platform(), None
    requested = _requested(argv)
    if isinstance(requested, str):
        from rlcode.cli.errors import UserError

        try:
            info = previewed = platform.preview_platform(requested, info)
        except ValueError as error:
            raise UserError(f"{error}\n  e.g. rlcode fit --config FILE --run.platform_profile h100x4 --print_config") from None
    profile = platform.profile_for(info)
    if not profile:
        return args, None
    user = user_settings(parser, argv)
    label = platform.PROFILE_LABELS[platform.profile_kind(info)]
    if user.get(_SWITCH, True) is False:
        return args, ProfileChoice(label, switched_off=True)
    choice = ProfileChoice(label, previewed=previewed)
    sharding = _sharding(info, user)
    if sharding is not None:
        profile["trainer.strategy"], choice.reasons["trainer.strategy"] = sharding
    for key, value in profile.items():
        if key.startswith("model.vllm.") and user.get("model.rollout_backend") != "vllm":
            continue  # the engine's settings matter with rollout_backend vllm only (default: hf)
        if _is_set(key, user):
            choice.kept[key] = _value_of(key, user)
        else:
            choice.chosen[key] = value
    if previewed is not None and not _is_set("trainer.precision", user):  # what that GPU would train in
        strategy = user.get("trainer.strategy") or choice.chosen.get("trainer.strategy")
        sharded = str(strategy).lower() in STRATEGY_WORDS
        choice.chosen["trainer.precision"], choice.reasons["trainer.precision"] = platform.precision_for(info, sharded)
    return argv + [f"--{key}={value if isinstance(value, str) else json.dumps(value)}"  # a quoted string stays quoted
                   for key, value in choice.chosen.items()], choice


def _requested(argv: list[str]):
    """The command line's ``--run.platform_profile`` as given (True when absent): a GPU to preview is a
    word other than a YAML boolean. (A config file's value: only true/off, read with the others.)"""
    value = True
    for i, arg in enumerate(argv):
        if arg == f"--{_SWITCH}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(f"--{_SWITCH}="):
            value = arg.split("=", 1)[1]
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "on", "off", "yes", "no", "1", "0"):
        return True
    return value


def _sharding(info, user: dict) -> tuple[str, str] | None:
    """DDP or FSDP for the configured model on several GPUs (None: one GPU, or its size unknown here)."""
    if info.gpu_count < 2:
        return None
    if user.get("model.quantization") is not None:  # FSDP2 does not shard bitsandbytes' packed weights
        return "ddp", "a quantized base is not sharded"
    from rlcode.models.aliases import SMOLLM2_ALIAS
    from rlcode.models.loading import parameter_count

    parameters = parameter_count(user.get("model.model_name") or SMOLLM2_ALIAS)  # the Learner's default model
    if parameters is None:
        return None
    state = platform.training_state_bytes(parameters, lora=user.get("model.lora") is not None,
                                          quantization=user.get("model.quantization"))
    return platform.sharding_choice(info, state)


def user_settings(parser, argv: list[str]) -> dict:
    """The keys the configs and command line set (no defaults), flattened, without the subcommand
    and ``init_args`` levels: ``{"model.micro_batch_size": 4, ...}``."""
    argv = [arg for arg in argv if arg != "--print_config" and not arg.startswith("--print_config=")]
    start = Namespace()
    subcommand = _subcommand(parser, argv)
    # The link trainer.precision -> model.precision needs its source even when nothing sets it.
    start[f"{subcommand}.trainer.precision" if subcommand else "trainer.precision"] = None
    raw = parser.parse_args(argv, namespace=start, defaults=False, _skip_validation=True)
    if subcommand:
        raw = raw.get(subcommand) or Namespace()
    settings = {}
    for key in raw.keys():
        if key == "trainer.precision" and raw[key] is None:
            continue
        settings[".".join(part for part in key.split(".") if part != "init_args")] = raw[key]
    return settings


def _subcommand(parser, argv: list[str]) -> str | None:
    choices = getattr(parser._subcommands_action, "choices", None) if parser._subcommands_action else None
    return next((arg for arg in argv if choices and arg in choices), None)


def _is_set(key: str, user: dict) -> bool:
    """Set by the user: the key itself, or a whole section above it (``model.vllm: null``)."""
    parts = key.split(".")
    return any(".".join(parts[:end]) in user for end in range(2, len(parts) + 1))


def _value_of(key: str, user: dict):
    parts = key.split(".")
    for end in range(len(parts), 1, -1):
        prefix = ".".join(parts[:end])
        if prefix in user:
            value = user[prefix]
            for part in parts[end:]:
                value = getattr(value, part, None) if value is not None else None
            return value
    return None


def _text(value) -> str:
    return json.dumps(value) if isinstance(value, (bool, type(None))) else str(value)
