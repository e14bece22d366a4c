"""The classes a config's sections are built from: ``model:`` the Learner, ``model.mode:`` a training
mode, ``data:`` a DataModule, ``run:`` ``RunSettings`` below, and the callbacks' sections (``eval:``,
``game_eval:``, ``rollout_log:``, ``checkpoint:``). The CLI binds these, and the range check and the
resume guard read their settings' annotations (``rlcode.setting``) from the same table."""

from __future__ import annotations

from typing import Annotated, Literal

from rlcode.callbacks import GameEval, MBPPEval, RolloutLogging, StepCheckpoint
from rlcode.data.datamodule import MBPPDataModule
from rlcode.data.games import GameDataModule
from rlcode.modes import GRPO, SPIRAL, CodeGame, MultiStepMBPP
from rlcode.setting import COUNT, free
from rlcode.training.learner import Learner

WandbMode = Literal["online", "offline", "disabled"]


class RunSettings:
    def __init__(self, experiment: Annotated[str, free()] = "rlcode", root_dir: Annotated[str, free()] = "runs",
                 wandb: Annotated[WandbMode, free()] | None = None, wandb_project: Annotated[str, free()] = "rlcode",
                 cpu_threads: Annotated[int, free(COUNT)] | None = None,
                 platform_profile: Annotated[bool | str, free()] = True) -> None:
        """Where the run's files go and which loggers write them.

        Args:
            experiment: name of the run's folder under ``root_dir`` (and of the W&B run group).
            root_dir: parent folder of all experiments.
            wandb: "online", "offline" or "disabled"; None reads ``WANDB_MODE`` (unset: disabled).
                Online without a reachable server or an API key falls back to offline.
            wandb_project: W&B project name.
            cpu_threads: torch's CPU threads (None: one per core). On a CPU shared with other jobs,
                1 can be several times faster than 2.
            platform_profile: on a GPU, the detected kind's micro-batch, recomputation, eval
                batch and size and vLLM share fill the keys no config sets (docs/configs.md, "Platform profiles").
                A GPU kind instead (v100, a100, h100, with xN for N GPUs: h100x4) applies that GPU's
                profile and precision wherever it runs: with --print_config, a preview from a login node.
        """
        self.experiment = experiment
        self.root_dir = root_dir
        self.wandb = wandb
        self.wandb_project = wandb_project
        self.cpu_threads = cpu_threads
        self.platform_profile = platform_profile


CALLBACK_SECTIONS = {"eval": MBPPEval, "game_eval": GameEval, "rollout_log": RolloutLogging, "checkpoint": StepCheckpoint}
# Each section and the classes it may hold (one: always that class; several: the config's class_path picks).
SECTIONS: dict[str, tuple[type, ...]] = {
    "model": (Learner,),
    "model.mode": (GRPO, SPIRAL, MultiStepMBPP, CodeGame),  # rlcode.cli.help.MODES names them for users
    "data": (MBPPDataModule, GameDataModule),
    "run": (RunSettings,),
    **{section: (callback,) for section, callback in CALLBACK_SECTIONS.items()},
}
