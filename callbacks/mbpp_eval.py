"""MBPP evaluation before, during and after training (initial, interval and final evals).

Each eval logs ``mbpp_eval/pass_rate``, ``mbpp_eval/problems_passed`` (greedy) and, with
``num_samples > 0``, ``mbpp_eval/pass@k`` (``humaneval_eval/...`` under ``benchmark: humaneval``),
at the trainer's global step; it writes every problem's
completion and verdict to ``<run dir>/eval/step_<n>.json``. ``MBPP_EVAL_NUM_QUESTIONS`` in the
environment overrides ``num_questions``, e.g. for a quick check of a big
recipe.

``rlcode validate`` (Lightning's validation loop, batches from the DataModule) scores as many problems
as this callback would: ``MBPP_EVAL_NUM_QUESTIONS``, else ``data.num_eval_tasks`` when set, else
``num_questions``; and the callback writes its per-problem results to
``eval/validate_step_<n>.json`` (``rlcode test``: ``eval/test_step_<n>.json``; the environment variable
sizes it too), n the checkpoint's step, in the checkpoint's own run directory when it lies in one
(``<run>/checkpoints/``), else in this command's. Validate and test generate and judge with this
callback's settings (``max_new_tokens``, sampling, timeout, batch size: ``rlcode.eval.settings``),
and every verdict file records them under ``"generation"``.

A stop signal is acted on between batches (``rlcode.stopping``: ``StopPoint.EVAL_BATCH``): a running eval is
abandoned, writes no file and is not recorded, the run saves and stops, and a resumed run evaluates
at its first step again when an eval was due there (at start or at an interval step).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal

import lightning as L
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info

from rlcode.callbacks.checkpointing import save_and_stop
from rlcode.data.prompts import build_prompt
from rlcode.eval.policy_scoring import BENCHMARK_NAMES, EvalReport, score_policy
from rlcode.eval.passk import mean_pass_at_k
from rlcode.eval.progress import EvalProgress
from rlcode.eval.settings import EvalSettings, resolve
from rlcode.run_dir import checkpoint_metadata, run_directory
from rlcode.run_dir.checkpoint_file import checkpoint_run_directory, original_checkpoint
from rlcode.setting import COUNT, COUNT_OR_ZERO, POSITIVE, TEMPERATURE, check_arguments, free
from rlcode.stopping import StopPoint, Stopped

NUM_QUESTIONS_ENV = "MBPP_EVAL_NUM_QUESTIONS"
BENCHMARKS = tuple(BENCHMARK_NAMES)


class MBPPEval(L.Callback):
    def __init__(
        self,
        num_questions: Annotated[int, free(COUNT)] | None = 5,
        every_n_steps: Annotated[int, free(COUNT_OR_ZERO)] = 20,
        at_start: Annotated[bool, free()] = True,
        at_end: Annotated[bool, free()] = True,
        num_samples: Annotated[int, free(COUNT_OR_ZERO)] = 0,
        k: Annotated[list[int], free(COUNT)] = [1],  # noqa: B006 (jsonargparse needs the literal default)
        temperature: Annotated[float, free(TEMPERATURE)] = 0.2,
        max_new_tokens: Annotated[int, free(COUNT)] | None = None,
        timeout: Annotated[float, free(POSITIVE)] = 10.0,
        batch_size: Annotated[int, free(COUNT)] | None = None,
        sandbox_workers: Annotated[int, free(COUNT)] | None = None,
        benchmark: Annotated[Literal["mbpp", "humaneval"], free()] = "mbpp",
        rollout_precision: Annotated[Literal["same", "int8"], free()] = "same",
    ) -> None:
        """Score the policy on the DataModule's eval split (``data.eval_split``).

        Args:
            num_questions: first N problems of the split (None: all); ``MBPP_EVAL_NUM_QUESTIONS``
                overrides it.
            every_n_steps: evaluate every N optimizer steps (0: only at start and end).
            at_start: evaluate before the first step (the baseline): at the run's first start only, not
                when a resume or a requeue starts it again at a later step.
            at_end: evaluate after the last step.
            num_samples: completions sampled per problem for pass@k (0: greedy pass@1 only).
            k: the k of pass@k (each must be <= num_samples).
            temperature: sampling temperature of the pass@k samples.
            max_new_tokens: generation limit (None: the model's ``max_new_tokens``).
            timeout: seconds each program may run.
            batch_size: prompts generated together (speed only: greedy completions do not depend
                on it); None: the DataModule's ``eval_batch_size`` (16 on CPU, 32 on a GPU by default).
            sandbox_workers: sandbox worker processes (None: the node's cores shared among its ranks).
            benchmark: "mbpp" (the DataModule's ``eval_split``) or "humaneval" (HumanEval's 164
                problems, which training never sees; also what ``rlcode validate`` / ``test`` score).
                Metrics are ``<benchmark>_eval/...``.
            rollout_precision: the sampler of the eval's completions, "same" (the policy in full
                precision, whatever ``model.rollout_precision`` trains with) or "int8" (the hf backend's
                int8 copy, CPU); the eval files record it.
        """
        if benchmark not in BENCHMARKS:
            raise ValueError(f"eval.benchmark must be one of {', '.join(BENCHMARKS)}, got {benchmark!r}")
        check_arguments(MBPPEval, locals(), prefix="eval.")  # Python callers; the CLI checked before building
        self.num_questions = num_questions
        self.every_n_steps = every_n_steps
        self.at_start = at_start
        self.at_end = at_end
        self.num_samples = num_samples
        self.k = list(k)
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.timeout = timeout
        self.batch_size = batch_size
        self.sandbox_workers = sandbox_workers
        self.benchmark = benchmark
        self.rollout_precision = rollout_precision
        self._pool = None
        self._last_step: int | None = None
        self._loop_reports: list = []  # rlcode validate / test: the batches' reports
        self._loop_settings: dict = {}

    @property
    def effective_num_questions(self) -> int | None:
        override = _environment_override()
        return self.num_questions if override is None else override

    # ---- rlcode validate / test --------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        self._loop_reports: list = []
        datamodule = trainer.datamodule
        if stage == "fit" and hasattr(datamodule, "eval_tasks"):
            pl_module.history.eval_problems = self.effective_num_questions  # the banner says it at fit start
        # Before any dataloader exists: validate / test read the benchmark from the DataModule.
        if hasattr(datamodule, "eval_benchmark"):
            datamodule.eval_benchmark = self.benchmark
        if stage not in ("validate", "test") or not hasattr(datamodule, "num_eval_tasks"):
            return
        # validate / test score as this callback does during fit: its batch size sizes the loader's
        # batches (made after setup), and the loop's start hands the module the other settings.
        if self.batch_size is not None:
            datamodule.eval_batch_size = self.batch_size
        override = _environment_override()
        if override is not None:
            datamodule.num_eval_tasks = override
        elif stage == "validate" and datamodule.num_eval_tasks is None:
            datamodule.num_eval_tasks = self.num_questions  # the split this callback scores during fit

    def on_validation_start(self, trainer, pl_module) -> None:
        self._hand_over_settings(trainer, pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._hand_over_settings(trainer, pl_module)

    def _hand_over_settings(self, trainer, pl_module) -> None:
        """What the mode's validation / test step scores with (``MBPPPassRate`` reads it)."""
        if hasattr(trainer.datamodule, "eval_tasks"):
            pl_module.eval_settings = self.settings(pl_module, trainer.datamodule)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, outputs)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, outputs)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._write_loop_report(trainer, getattr(trainer.datamodule, "eval_split", "validation"), "validate")

    def on_test_end(self, trainer, pl_module) -> None:
        self._write_loop_report(trainer, "test", "test")

    def _collect(self, trainer, outputs) -> None:
        if isinstance(outputs, EvalReport) and not trainer.sanity_checking:
            self._loop_reports.append(outputs)

    def _write_loop_report(self, trainer, split: str, command: str) -> None:
        """The loop's per-problem results in one file, as an eval during fit writes them, naming the
        benchmark, the checkpoint scored (``ckpt_path`` null: the model as configured, no checkpoint) and
        its step, beside the checkpoint's run, so a trained model's verdicts cannot pass for the base
        model's."""
        if trainer.state.fn not in ("validate", "test"):
            return  # fit: this callback's own evals write theirs
        reports = _gathered(self._loop_reports)
        problems = [problem for report in reports for problem in report.problems]
        self._loop_settings = reports[0].settings if reports else {}
        self._loop_reports = []
        if not problems or not trainer.is_global_zero:
            return
        checkpoint, step, folder = _scored_checkpoint(trainer)
        settings = self._loop_settings
        counts = {p.task_id: (p.samples, p.samples_passed) for p in problems if p.samples}
        pass_at_k = mean_pass_at_k(counts, list(settings.get("k", []))) if counts else {}
        report = EvalReport(step, self._where(split), settings.get("temperature", 0.0),
                            sorted(problems, key=lambda p: p.task_id), pass_at_k, self.benchmark, settings)
        path = folder / "eval" / f"{command}_step_{step}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**report.as_json(), "ckpt_path": checkpoint}, indent=2))
        rank_zero_info(f"  per-problem results: {path}")

    # ---- when --------------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        # A resumed run whose checkpoint's history holds an eval at this step does not repeat it; one
        # stopped before (or during) the eval due at its step runs that eval first.
        step = trainer.global_step
        if ((self.at_start and step == 0) or self._due(step)) and not pl_module.history.evaluated_at(step):
            self.evaluate(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self._due(step) and step != self._last_step:
            self.evaluate(trainer, pl_module)

    def _due(self, step: int) -> bool:
        return bool(self.every_n_steps) and step > 0 and step % self.every_n_steps == 0

    def on_train_end(self, trainer, pl_module) -> None:
        # Stopped by a signal (set at a batch end, an earlier hook): no final eval
        if self.at_end and trainer.global_step != self._last_step and pl_module.history.stopped_by is None:
            self.evaluate(trainer, pl_module)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._pool is not None:
            self._pool.__exit__(None, None, None)
            self._pool = None

    # ---- what --------------------------------------------------------------------------------
    def evaluate(self, trainer, pl_module) -> EvalReport | None:
        datamodule = trainer.datamodule
        if not hasattr(datamodule, "eval_tasks"):
            return None  # not an MBPP mode (e.g. SPIRAL games: see callbacks/game_eval.py)
        token, ranks = pl_module.stop_token, pl_module.ranks()
        if token.agreed(ranks, StopPoint.EVAL_START):  # asked during the step: the save first, the eval on resume
            save_and_stop(trainer, pl_module)
            return None
        tasks = datamodule.eval_tasks(self.effective_num_questions)
        prompts = [pl_module.render(build_prompt(task, datamodule.prompt_format)) for task in tasks]
        # A line per batch while it runs; the last batch's is the summary line below.
        where = self._where(datamodule.eval_split)
        label = BENCHMARK_NAMES[self.benchmark]
        progress = EvalProgress(f"{label} eval at step {trainer.global_step} ({where})", len(tasks), last_line=False)
        settings = self.settings(pl_module, datamodule)
        try:
            report = score_policy(
                pl_module, prompts, tasks, self._sandbox(pl_module), step=trainer.global_step,
                split=where, num_samples=settings.num_samples, ks=settings.k, temperature=settings.temperature,
                max_new_tokens=settings.max_new_tokens, timeout=settings.timeout, batch_size=settings.batch_size,
                progress=progress, benchmark=self.benchmark, should_stop=lambda: token.agreed(ranks, StopPoint.EVAL_BATCH),
                rollout_precision=self.rollout_precision)
            report.settings = settings.as_json()
        except Stopped as stopped:
            # Nothing written or recorded: the history has no eval at this step, so a resume runs it.
            rank_zero_info(f"  {label} eval at step {trainer.global_step} abandoned ({stopped}); "
                           "it runs again on resume")
            save_and_stop(trainer, pl_module)
            return None
        self._last_step = trainer.global_step
        path = None
        if trainer.is_global_zero:
            path = run_directory(trainer) / "eval" / f"step_{trainer.global_step}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report.as_json(), indent=2))
            for logger in trainer.loggers:
                logger.log_metrics(report.metrics(), step=trainer.global_step)
                logger.save()
        pl_module.history.add_eval({"step": trainer.global_step, **report.metrics(), "pass_rate": report.pass_rate,
                                    "num_questions": len(report.problems), "path": str(path) if path else None})
        rank_zero_info(f"  {label} eval at step {trainer.global_step} ({where}): pass rate "
                       f"{report.pass_rate:.2f} ({report.problems_passed}/{len(report.problems)}), "
                       f"{progress.problems_per_second:.2f} problems/s"
                       + "".join(f", {name}={value:.2f}" for name, value in report.pass_at_k.items()))
        return report

    def settings(self, pl_module, datamodule) -> EvalSettings:
        """What every eval of this run generates and judges with (fit's, validate's and test's alike)."""
        return resolve(pl_module, datamodule, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                       num_samples=self.num_samples, k=self.k, timeout=self.timeout, batch_size=self.batch_size)

    def _where(self, split: str) -> str:
        """The problems a report names: HumanEval's 164 (one set, no splits), else MBPP's ``split``."""
        return "humaneval" if self.benchmark == "humaneval" else split

    def _sandbox(self, pl_module):
        if self._pool is None:
            self._pool = pl_module.sandbox_pool(self.timeout, workers=self.sandbox_workers)
            self._pool.__enter__()
        return self._pool


def _scored_checkpoint(trainer) -> tuple[str | None, int, Path]:
    """(the checkpoint validate / test scored as the user named it, its step, the run directory its
    report goes to). Lightning's validate and test restore the weights, not the step: the checkpoint's
    metadata says it (a sharded folder's without its tensors)."""
    if not trainer.ckpt_path:
        return None, trainer.global_step, run_directory(trainer)
    step = int(checkpoint_metadata(trainer.ckpt_path).get("global_step", 0))
    return str(original_checkpoint(trainer.ckpt_path)), step, (checkpoint_run_directory(trainer.ckpt_path)
                                                               or run_directory(trainer))


def _environment_override() -> int | None:
    override = os.environ.get(NUM_QUESTIONS_ENV)
    if not override:
        return None
    try:
        return int(override)
    except ValueError:
        raise ValueError(f"{NUM_QUESTIONS_ENV}={override!r} is not an integer: unset it or give a count") from None


def _gathered(reports: list) -> list:
    """Every rank's reports (each rank scored its share of the batches), on every rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return reports
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, reports)
    return [report for share in shares for report in share]

