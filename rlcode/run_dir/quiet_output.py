"""A run's output says what the run does: no library warnings a user cannot act on, and plain lines
in a log file.

Each filter names one message exactly and says why it is noise for rlcode. The model-cache warning
of transformers 5 (``past_key_values`` is deprecated) is fixed where rlcode calls the model
(``rlcode.models.cache_name``), not filtered.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

# (message regex, why it says nothing a user can act on)
NOISE = (
    (r".*isinstance\(treespec, LeafSpec\)", "a deprecation inside Lightning's own pytree helper"),
    (r"Checkpoint directory .* exists and is not empty",
     "a resumed run writes into its own run directory, whose checkpoints/ holds the run's earlier "
     "checkpoints by design; a new run always gets a new version_N directory"),
    (r"The dirpath has changed from",
     "a run started from another run's checkpoint (or `rlcode validate --ckpt_path`) writes into its "
     "own directory; what is not reloaded is the old directory's best-k list, which rlcode does not use "
     "(checkpoints are kept by step)"),
    (r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
     "`rlcode validate` / `test` score a checkpoint's weights, and a resumed run's callbacks keep nothing "
     "that matters in their own state (the run history is the module's): a checkpoint written under other "
     "checkpoint or eval settings has callback states under other names, which is expected"),
    (r"`(is_gradient_checkpointing|gradient_checkpointing_enable)` is deprecated",
     "peft calls transformers' old gradient-checkpointing names when it wraps a model in LoRA; rlcode "
     "itself calls the new ones (rlcode.models.loading)"),
)


def quiet_library_noise() -> None:
    """Filter the messages of NOISE, Lightning's litlogger advert and seed line, and (in a log file, not a terminal)
    the progress bars of model loading, which would write ``\\r``-joined redraws into it."""
    for pattern, _why in NOISE:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(lambda record: "litlogger" not in record.getMessage())
    # "Seed set to 0" on stderr before every command: the seed is in the run's config.yaml
    # (seed_everything, the drawn value when it is true), and the line made a 2-line error 3 lines.
    logging.getLogger("lightning.fabric.utilities.seed").addFilter(
        lambda record: not record.getMessage().startswith("Seed set to"))
    # Printed when peft loads bitsandbytes on a CPU with AVX512-BF16 (every LoRA run there): an optional
    # kernel from the Hub for 4-bit matmuls is missing, and bitsandbytes' own kernel runs instead.
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        lambda record: "Failed to load CPU gemm_4bit_forward" not in record.getMessage())
    if not interactive(sys.stderr):
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # downloads; read when huggingface_hub loads
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as transformers_logging

        disable_progress_bars()
        transformers_logging.disable_progress_bar()  # "Loading weights" of transformers 5


def interactive(stream) -> bool:
    """Whether ``stream`` is a terminal (a progress bar redraws in place) rather than a file or a pipe."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


def without_wandb_anonymous(logger):
    """Lightning's WandbLogger always passes ``anonymous`` (None by default) to ``wandb.init``, and
    wandb >= 0.19 warns on every run that the setting has no effect: drop the key Lightning set."""
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous") is None:
        init.pop("anonymous", None)
    return logger


def load_checkpoints_weights_only(config) -> None:
    """``--weights_only`` unset: True. rlcode's checkpoints hold tensors and plain types only
    (``rlcode.training.resume_state``), so torch's safe unpickler loads them; Lightning >= 2.6 passes
    the unset value on to torch, which on torch 2.4-2.5 then warns (a FutureWarning about
    ``weights_only=False``) at every resume, validate and test. Torch >= 2.6 already defaults to True."""
    if "weights_only" in config and config["weights_only"] is None:  # the argument exists from Lightning 2.6
        config["weights_only"] = True
