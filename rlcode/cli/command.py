"""``rlcode fit|validate|test --config configs/X.yaml``: the LightningCLI of the project.

The config surface is the typed ``__init__`` of each class: ``model:`` is ``rlcode.training.learner.Learner``
(the settings every mode reads), ``model.mode:`` the training mode (``class_path: rlcode.modes.SPIRAL`` and
its ``init_args``; GRPO when a config names none), ``data:`` is ``rlcode.data.datamodule.MBPPDataModule``, ``eval:`` / ``rollout_log:`` / ``checkpoint:``
are callbacks, ``run:`` is ``RunSettings`` (``rlcode.cli.sections``), ``trainer:`` is Lightning's. Several ``--config``
files overlay left to right; ``--print_config`` shows the merged result.

Run directory: ``<run.root_dir>/<run.experiment>/version_<n>/`` holds run.json (the run id, which is
the W&B run id, and the SLURM job id), config.yaml, console.log, metrics.csv, checkpoints/, eval/, rollouts.jsonl
and plots/. ``--ckpt_path last`` resumes the newest run of the experiment that has a ``last.ckpt``,
in the same directory and the same W&B run; under SLURM only a run of this job counts, so a requeued
job picks up where it stopped and a new job starts fresh. A checkpoint path inside a run directory
also continues that run's directory.

SLURM: rlcode's GracefulShutdown handles SIGUSR1 (save after the step, then ``scontrol requeue``),
so Lightning's own auto-requeue is switched off here whenever SLURM is detected
(``SLURMEnvironment(auto_requeue=False)``, decided in code, never in a YAML file).

Secrets (``WANDB_API_KEY``, ``HF_TOKEN``) come from the environment or a ``.env`` file, never from
configs, so they cannot end up in the saved config.yaml.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# Before torch loads (lightning imports it): OpenMP threads that spin while they wait turn a shared
# CPU into a crawl: a spinning thread burns the core its descheduled partner needs (on 2 busy cores a
# SmolLM2 decoding step took several times as long with spinning threads as with passive ones; a dated
# run, benchmarks/journal/speed.md). On an idle machine passive waiting costs little.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import lightning as L  # noqa: E402
from jsonargparse import ArgumentError  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback  # noqa: E402
from lightning.pytorch.utilities import rank_zero_only  # noqa: E402

from rlcode.callbacks import (GracefulShutdown, RunSummary, StepMetrics, StepProgressBar,  # noqa: E402
                              TrainingPlots)
from rlcode.cli import errors as cli_errors  # noqa: E402
from rlcode.cli import help as cli_help  # noqa: E402
from rlcode.cli import old_form as cli_old_form  # noqa: E402
from rlcode.cli import overlays as config_overlays  # noqa: E402
from rlcode.cli import prechecks as cli_prechecks  # noqa: E402
from rlcode.cli import resume_guard as cli_resume_guard  # noqa: E402
from rlcode.stopping import Stopped  # noqa: E402
# Imported so that jsonargparse knows the modes: `--model.mode SPIRAL` works and the help lists them.
from rlcode.modes import GRPO, SPIRAL, CodeGame, MultiStepMBPP  # noqa: E402, F401
from rlcode.training.fsdp_strategy import STRATEGY_WORDS, resolve_strategy  # noqa: E402
from rlcode.training.learner import Learner  # noqa: E402
from rlcode.training.process_group_exit import leave_process_group  # noqa: E402
from rlcode.data.datamodule import MBPPDataModule  # noqa: E402, F401
from rlcode.data.games import GameDataModule  # noqa: E402, F401
from rlcode.data.mbpp import MBPPDataError  # noqa: E402
from rlcode.errors import SettingError  # noqa: E402
from rlcode.cli.export import main as export_main  # noqa: E402
from rlcode.models.embedded_smollm2 import EmbeddedModelUnavailable  # noqa: E402
import rlcode.platform as platform  # noqa: E402  (module access: tests fake detect_platform on it)
from rlcode.cli.platform_profile import with_profile  # noqa: E402
from rlcode.run_dir import (ResumableCSVLogger, discard_unstarted, find_last_checkpoint, finish_wandb,  # noqa: E402
                            resumed_step, run_directory, run_loggers, version_of)
from rlcode.run_dir.checkpoint_file import (checkpoint_run_directory, is_sharded_checkpoint,  # noqa: E402
                                           joined_checkpoint_file)
from rlcode.run_dir.console_log import ConsoleLog  # noqa: E402
from rlcode.run_dir.identity import new_run_id, read_run  # noqa: E402
from rlcode.run_dir.loggers import reachable, say_once  # noqa: E402
from rlcode.models.loading import ModelNotFound  # noqa: E402
from rlcode.run_dir.quiet_output import load_checkpoints_weights_only, quiet_library_noise  # noqa: E402
from rlcode.rollout.openai.client import ServedModelError  # noqa: E402
from rlcode.sandbox.isolation import IsolationUnavailable  # noqa: E402
from rlcode.cli.sections import CALLBACK_SECTIONS, RunSettings  # noqa: E402

# Missing data, model, sandbox layer or served model, or a setting found wrong when the run starts:
# the user's set-up, not a bug, so one line instead of a traceback.
_SETUP_ERRORS = (MBPPDataError, EmbeddedModelUnavailable, ModelNotFound, IsolationUnavailable, ServedModelError,
                 SettingError)

class RLCodeCLI(LightningCLI):
    def __init__(self, *args: Any, console: ConsoleLog | None = None, **kwargs: Any) -> None:
        self.console = console
        super().__init__(*args, **kwargs)

    def _run_subcommand(self, subcommand: str) -> None:
        keeps_log = any(isinstance(logger, ResumableCSVLogger) for logger in self.trainer.loggers)
        if self.console is not None and keeps_log and self.trainer.global_rank == 0:
            self.console.attach(run_directory(self.trainer))  # console.log, beside metrics.csv
        elif self.console is not None:
            self.console.stop()
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            # Failed before the run wrote anything of its own: leave no empty version_N behind.
            finish_wandb()
            discard_unstarted(self.trainer.loggers)
            raise
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # No `predict`: the modes have no predict_step. `validate`/`test` score a model, `rlcode-eval` samples.
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name != "predict"}

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        # Parse errors are raised, not printed with the whole usage: parse_arguments shortens them.
        # No abbreviations: `--model.temp 0.5` had set the temperature, while the same key in YAML is refused.
        return super().init_parser(**{"exit_on_error": False, "allow_abbrev": False, **kwargs})

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any],
                     subparser_kwargs: dict[str, Any]) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        self.parser.description, self.parser.epilog = cli_help.DESCRIPTION, cli_help.EPILOG
        if add_subcommands:  # RLCodeCLI(run=False), as tests and notebooks build it, has none
            cli_help.describe_subcommands(self.parser)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as error:  # a class's own check of its settings (e.g. num_generations=1)
            raise cli_errors.explain_init_error(error, self.arguments) from error

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(RunSettings, "run")
        # The training mode is model.mode's class (GRPO, SPIRAL, ...) and the data's class (MBPP
        # prompts, or games); configs that name neither get GRPO on MBPP.
        parser.set_defaults({"model.mode": {"class_path": cli_help.DEFAULT_MODE},
                             "data": {"class_path": "rlcode.data.datamodule.MBPPDataModule"}})
        for section, callback in CALLBACK_SECTIONS.items():
            parser.add_lightning_class_args(callback, section)
        # One precision knob: the trainer's decides the dtype the model's weights load in.
        parser.link_arguments("trainer.precision", "model.precision", compute_fn=_weight_precision)
        cli_help.retitle_groups(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # The user's own arguments: errors point into them and the summary's resume command repeats them.
        self.arguments = sys.argv[1:] if args is None else list(args)
        cli_old_form.check(self.arguments)  # a config of the form before modes: one line naming the new form
        config_overlays.check_not_only_overlays(self.arguments)  # alone, an overlay trains on the defaults
        try:
            # Before parsing, so that --print_config shows the GPU profile's values.
            argv, self._platform_profile = with_profile(parser, args)
            words = sys.argv[1:] if argv is None else list(argv)
            if "--print_config" in words:
                _print_config_of_the_mode(parser, [word for word in words if word != "--print_config"],
                                          self._subcommand_parsers)
            if argv is args:
                super().parse_arguments(parser, args)
            else:
                self.config = parser.parse_args(argv)
        except ArgumentError as error:
            raise cli_errors.explain_parse_error(str(error), self.arguments, self._subcommand_parsers) from error

    def _parse_ckpt_path(self) -> None:
        # Lightning replaces the config's model settings with the checkpoint's when --ckpt_path names a
        # file. For fit that would silently train the checkpoint's mode on the config's data, and drop a
        # changed micro_batch_size only when the path is explicit (not with `last`): instead the config
        # stays as given and cli_resume_guard refuses what may not change. validate/test keep it (they
        # score the checkpoint's model whatever the config says).
        if self.config.get("subcommand") != "fit":
            super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        _go_offline_if_hub_unreachable()
        cli_prechecks.check_before_building(config, self.arguments)  # bad values, a missing checkpoint, model or reward
        load_checkpoints_weights_only(config)
        if config["run"].get("cpu_threads"):
            import torch

            torch.set_num_threads(config["run"]["cpu_threads"])
        _choose_precision(config, getattr(self, "_platform_profile", None))
        self._resume_version = self._resume_step = None
        if config.get("ckpt_path") == "last":
            config["ckpt_path"], version = find_last_checkpoint(config["run"])
        else:
            version = version_of(config.get("ckpt_path"), config["run"])
        if "ckpt_path" in config:  # RLCodeCLI(run=False), as tests and notebooks build it, has no ckpt_path
            config["ckpt_path"] = _readable_by_the_strategy(config["ckpt_path"], self.subcommand, config["trainer"])
        if self.subcommand == "fit":
            cli_resume_guard.check_resume(config["ckpt_path"], config["model"])  # before resumed_step trims files
            cli_resume_guard.check_not_finished(config["ckpt_path"], config["trainer"].get("max_steps"))
            self._resume_version = version  # keep writing into the interrupted run's directory
            self._resume_step = resumed_step(config["ckpt_path"], config["run"], version)
        if self.subcommand == "fit" and config["trainer"].get("limit_val_batches") is None:
            # During fit the MBPP eval callback evaluates (on its own schedule); Lightning's
            # validation loop serves `rlcode validate`.
            config["trainer"]["limit_val_batches"] = 0

    def instantiate_trainer(self, **kwargs: Any):
        run: RunSettings = self._get(self.config_init, "run")
        trainer_config = self._get(self.config_init, "trainer", default={})
        scored = self._scored_run()
        if scored is not None:  # validate/test of a run's checkpoint: its report goes into that run, and
            # nothing else is written (a logger would leave a stray version_N with config.yaml, metrics.csv
            # and run.json per call)
            kwargs["logger"], self.model.run_id = False, read_run(scored).get("run_id") or new_run_id()
            self.save_config_callback = None
        elif trainer_config.get("logger") in (None, True):  # not chosen in the config: the run's loggers
            kwargs["logger"], self.model.run_id = run_loggers(run, self._resume_version, self._resume_step)
        strategy = resolve_strategy(trainer_config.get("strategy", "auto"))  # "fsdp": rlcode's FSDP2, not FSDP1
        if strategy is not trainer_config.get("strategy", "auto"):
            kwargs["strategy"] = strategy
        plugin = _slurm_without_auto_requeue(trainer_config)
        if plugin is not None:
            kwargs["plugins"] = [*(trainer_config.get("plugins") or []), plugin]
        # Always on, in any order: each reads what it shows from the module's run history, filled by
        # the module and by the other callbacks in an earlier hook (rlcode.training.run_history).
        configured = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        callbacks = [RunSummary(command=self.arguments), *configured, StepMetrics(), TrainingPlots(),
                     GracefulShutdown()]
        if trainer_config.get("enable_progress_bar") is not False:
            callbacks.append(StepProgressBar())  # steps/max_steps, not Lightning's "Epoch 0" batches
        return self._instantiate_trainer({**trainer_config, **kwargs}, callbacks)


    def _scored_run(self) -> Path | None:
        """The run directory of the checkpoint ``validate``/``test`` scores (None: ``fit``, no checkpoint,
        or one outside a run)."""
        if self.subcommand not in ("validate", "test"):
            return None
        ckpt_path = (self.config[self.subcommand] or {}).get("ckpt_path")
        return checkpoint_run_directory(ckpt_path) if ckpt_path and Path(ckpt_path).exists() else None


def _print_config_of_the_mode(parser, words: list[str], subcommand_parsers) -> None:
    """``--print_config``, less the evaluation group the run's data cannot feed: ``eval:`` (MBPP and
    HumanEval problems) for game data, ``game_eval:`` (games against a random mover) for MBPP data.
    Both groups stay in the parser, so overlays and platform profiles that set them keep working."""
    config = parser.parse_args(words)
    subcommand = config.get("subcommand")
    if subcommand is None:  # a bare `rlcode --print_config`: jsonargparse's own
        parser.parse_args([*words, "--print_config"])
        return
    own = config[subcommand]
    unread = "eval" if own["data"]["class_path"].endswith(".GameDataModule") else "game_eval"
    own.pop(unread, None)
    sys.stdout.write(subcommand_parsers[subcommand].dump(own, skip_unset=False, skip_validation=True))
    raise SystemExit(0)


def _choose_precision(config, profile=None) -> None:
    """Unset ``trainer.precision``: the detected hardware's (bf16-mixed from sm_80, 16-mixed on V100 and
    older, 32-true on CPU). Says what it found and chose, once, at start."""
    previewed = getattr(profile, "previewed", None)  # run.platform_profile names a GPU to preview
    info = previewed or platform.detect_platform()
    problem = None if previewed else platform.torch_build_problem(info)  # a CUDA 13 torch on a V100 fails at its first kernel
    if problem:
        raise cli_errors.UserError(problem)
    chosen = config["trainer"].get("precision")
    how = "from the config"
    if chosen is None:
        chosen, how = platform.precision_for(info, str(config["trainer"].get("strategy")).lower() in STRATEGY_WORDS)
        config["trainer"]["precision"] = chosen
        model = config.get("model") or {}
        if "precision" in model:
            model["precision"] = _weight_precision(chosen)
    profile_text = f"; {profile.describe()}" if profile is not None else ""
    print(f"platform: {info.describe()}; precision {chosen} ({how}){profile_text}", flush=True)


def _readable_by_the_strategy(ckpt_path, subcommand: str | None, trainer_config) -> str | None:
    """A sharded (FSDP) checkpoint for a run without FSDP: validate / test read its shards joined into
    one temporary file; fit refuses (its optimizer state is sharded: resume it with FSDP)."""
    sharded_run = str(trainer_config.get("strategy")).lower() in STRATEGY_WORDS
    if not ckpt_path or sharded_run or not is_sharded_checkpoint(ckpt_path):
        return ckpt_path
    if subcommand == "fit":
        raise cli_errors.UserError(f"--ckpt_path {ckpt_path} is a sharded (FSDP) checkpoint\n"
                                   "  Resume it with --trainer.strategy fsdp, or export it (rlcode export) and start "
                                   "a new run from the exported folder")
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="rlcode-joined-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    print(f"{ckpt_path} is sharded (FSDP): joining its shards into {folder} for this run", flush=True)
    return str(joined_checkpoint_file(ckpt_path, folder))


def _weight_precision(precision) -> str:
    return "32-true" if precision is None else str(precision)


def _slurm_without_auto_requeue(trainer_config):
    """Under SLURM, a SLURMEnvironment with Lightning's auto-requeue off (rlcode requeues after the
    step), unless the config already chose a cluster environment; None elsewhere."""
    from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment

    if not SLURMEnvironment.detect():
        return None
    if any(isinstance(p, ClusterEnvironment) or "Environment" in str(p) for p in trainer_config.get("plugins") or []):
        return None
    return SLURMEnvironment(auto_requeue=False)


class _SaveConfig(SaveConfigCallback):
    """config.yaml in the run directory, and the same merged config in the W&B run's config."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        for logger in trainer.loggers:
            if type(logger).__name__ == "WandbLogger":
                logger.log_hyperparams({"config": self.config.as_dict()})


def _go_offline_if_hub_unreachable() -> None:
    """Without a reachable Hub, transformers/datasets retry for minutes: tell them to stay offline."""
    if os.environ.get("HF_HUB_OFFLINE"):
        return
    if not reachable("huggingface.co"):
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        say_once("hub", "Hugging Face Hub unreachable: running offline (local folders, the HF cache and "
                        "the embedded model only)")


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``rlcode`` console script."""
    from dotenv import load_dotenv

    quiet_library_noise()

    load_dotenv(dotenv_path=Path.cwd() / ".env", override=False)  # API keys only; never in configs
    argv, debug = cli_errors.take_debug_flag(sys.argv[1:] if args is None else list(args))
    if args is None:
        sys.argv[1:] = argv  # without --debug (LightningCLI reads sys.argv)
    else:
        args = argv
    if argv[:1] == ["export"]:  # not a Lightning subcommand: adapters or merged weights from a checkpoint
        return export_main(argv[1:])
    console = ConsoleLog().start()  # held in memory until the run directory is known
    try:
        RLCodeCLI(
            Learner,  # its mode (model.mode) is GRPO by default
            L.LightningDataModule,  # MBPPDataModule by default; GameDataModule for SPIRAL
            console=console,
            subclass_mode_model=False,
            parser_class=cli_help.RLCodeParser,  # rlcode's help formatter, in the modes' help too
            subclass_mode_data=True,
            args=args,
            save_config_callback=_SaveConfig,
            save_config_kwargs={"overwrite": True},  # a requeued job rewrites its config instead of crashing
            seed_everything_default=0,
            auto_configure_optimizers=False,  # the module's typed learning_rate/weight_decay are the surface
            trainer_defaults={"max_steps": 100, "log_every_n_steps": 1, "num_sanity_val_steps": 0,
                              "enable_model_summary": False},
        )
        leave_process_group()  # only after success: a multi-rank run must not abort in interpreter teardown
    except (*_SETUP_ERRORS, cli_errors.UserError) as error:  # messages that name the cause and the fix
        if debug:
            raise
        raise SystemExit(f"rlcode: {error}") from None
    except Stopped as stopped:  # validate / test stopped by a signal between batches: a clean exit, one line
        rank_zero_only(print)(f"rlcode {stopped}", flush=True)
    except cli_resume_guard.RunAlreadyFinished as finished:  # a requeued job of a finished run: exit 0, untouched
        rank_zero_only(print)(f"rlcode: {finished}", flush=True)
    finally:
        finish_wandb()
        console.stop()


if __name__ == "__main__":
    main()
