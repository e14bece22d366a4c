"""A short account at the end of ``fit``: what changed and where everything is."""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Sequence

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from rlcode.callbacks.run_dir import run_dir


def summarize(steps: int, seconds: float, rewards: list[tuple[int, float]], evals: list[dict], run: str,
              checkpoint: str | None, plot: str | None, interrupted: str | None = None,
              game_evals: list[dict] | None = None, trajectories: int = 0,
              successes: Sequence[tuple[str, int]] = (), max_steps: int | None = None, dry_run: bool = False,
              updates: int | None = None, resume: str | None = None) -> str:
    """The summary text (pure, so it can be tested without a trainer).

    ``successes``: (what is counted, count) over the run's ``trajectories``; ``updates``: steps that
    changed the weights; ``resume``: the command that continues an interrupted run.
    """
    took = _duration(seconds)
    of = f" of {max_steps}" if max_steps and max_steps > 0 else ""
    if dry_run:
        ended = f"stopped by {interrupted} at step {steps}{of}" if interrupted else f"finished {steps} steps"
        head = f"rlcode fit (dry run) {ended} in {took}: rollouts and rewards only, no weight updates, no checkpoint"
    elif interrupted:
        head = f"rlcode fit stopped by {interrupted} at step {steps}{of} in {took}"
    else:
        steps_text = f"{steps} optimizer steps" if updates is None or updates >= steps else \
            f"{steps} steps ({updates} updated the weights)"
        head = f"rlcode fit finished: {steps_text} in {took}"
    lines = [head]
    values = [r for _, r in rewards if not math.isnan(r)]
    if values:
        window = max(1, min(3, len(values) // 2))
        first, last = values[:window], values[-window:]
        lines.append(f"  mean reward: first {window} step(s) {sum(first) / len(first):+.3f} -> "
                     f"last {window} step(s) {sum(last) / len(last):+.3f}")
    if len(evals) == 1:
        only = evals[0]
        lines.append(f"  MBPP pass rate ({only.get('num_questions', '?')} problems): {only['pass_rate']:.2f} at "
                     f"step {only['step']}")
    elif evals:
        before, after = evals[0], evals[-1]
        lines.append(f"  MBPP pass rate ({after.get('num_questions', '?')} problems): {before['pass_rate']:.2f} at "
                     f"step {before['step']} -> {after['pass_rate']:.2f} at step {after['step']}")
    lines.extend(_game_lines(game_evals or []))
    lines.append(f"  run dir:    {run}")
    if checkpoint:
        lines.append(f"  checkpoint: {checkpoint}")
    if evals and evals[-1].get("path"):
        lines.append(f"  eval:       {evals[-1]['path']}")
    if plot:
        lines.append(f"  plot:       {plot}")
    if interrupted and resume and not dry_run:
        lines.append(f"  resume:     {resume}")
    if trajectories:  # ART's closing block: trajectories and success rates
        if dry_run:
            header = "Dry run complete: no weight updates."
        elif not interrupted and (not max_steps or max_steps < 0 or steps >= max_steps):
            header = "Training complete!"
        else:
            header = f"Training stopped at step {steps}{of}."
        lines += ["", header, f"  Total trajectories: {trajectories}"]
        lines += [f"  {meaning[:1].upper() + meaning[1:]}: {count} ({100 * count / trajectories:.1f}%)"
                  for meaning, count in successes]
        lines.append(f"  Steps completed: {steps}")
    return "\n".join(lines)


def resume_command(arguments) -> str | None:
    """The command that continues this run: its own arguments with ``--ckpt_path last`` (None when
    it was not started from a command line)."""
    if not isinstance(arguments, (list, tuple)) or not all(isinstance(a, str) for a in arguments):
        return None
    kept, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
        elif argument == "--ckpt_path":
            skip = True  # and its value
        elif not argument.startswith("--ckpt_path="):
            kept.append(argument)
    return shlex.join(["rlcode", *kept, "--ckpt_path", "last"])


def _game_lines(game_evals: list[dict]) -> list[str]:
    """Per game, win and invalid-move rates against a random mover, first eval -> last."""
    if not game_evals:
        return []
    before, after = game_evals[0], game_evals[-1]
    games = sorted({key.split("/")[1] for key in after if key.startswith("spiral/") and key.endswith("/win_rate")})
    return [f"  {game} vs random: win {before.get(f'spiral/{game}/win_rate', math.nan):.2f} -> "
            f"{after[f'spiral/{game}/win_rate']:.2f}, invalid moves "
            f"{before.get(f'spiral/{game}/invalid_move_rate', math.nan):.2f} -> "
            f"{after[f'spiral/{game}/invalid_move_rate']:.2f} (step {before['step']} -> {after['step']})"
            for game in games]


def game_banner(model: str, games: list[str], steps: int, episodes_per_step: int, opponent: str, run: str) -> str:
    """The header of a self-play run."""
    rule = "=" * 60
    return "\n".join(["rlcode SPIRAL", rule, f"Model: {model}", f"Games: {', '.join(games)}", f"Steps: {steps}",
                      f"Batch: {episodes_per_step} episodes, opponent: {opponent}", f"Run dir: {run}", rule])


def banner(model: str, train_tasks: int, eval_tasks: int | None, steps: int, prompts_per_step: int,
           generations: int, rewards: list[str], run: str, dry_run: bool, mode: str = "GRPO") -> str:
    """What is about to happen, printed before the first step (the ART toolkit's header)."""
    rule = "=" * 60
    return "\n".join([
        f"rlcode {mode}{' (dry run: no weight updates)' if dry_run else ''}", rule,
        f"Model: {model}",
        f"Problems: {train_tasks} train" + (f", {eval_tasks} eval" if eval_tasks else ""),
        f"Steps: {steps}",
        f"Batch: {prompts_per_step} prompts x {generations} generations",
        f"Rewards: {' + '.join(rewards)}",
        f"Run dir: {run}", rule])


def _model(module) -> str:
    """The model name, or for a served backend the served model and where it is (ART: "Using vLLM at ...")."""
    describe = getattr(module, "model_description", None)
    return describe() if callable(describe) else str(module.hparams.model_name)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class RunSummary(L.Callback):
    def __init__(self, command: list[str] | None = None) -> None:
        """Print what the run will do before it starts; afterwards steps, reward first vs last, pass
        rate before vs after, and where the run's files are.

        Args:
            command: the command's arguments (after ``rlcode``), for the resume hint of an interrupted run.
        """
        self.command = command
        self.text: str | None = None
        self._started = time.perf_counter()

    def on_fit_start(self, trainer, pl_module) -> None:
        self._started = time.perf_counter()

    @rank_zero_only
    def on_train_start(self, trainer, pl_module) -> None:
        from rlcode.callbacks.mbpp_eval import MBPPEval

        described, data = pl_module.run_description(), trainer.datamodule  # the mode's facts, via the learner
        if hasattr(data, "games"):
            print(game_banner(model=_model(pl_module), games=data.games, steps=trainer.max_steps,
                              episodes_per_step=data.episodes_per_step, opponent=described.opponent or "self",
                              run=str(run_dir(trainer))), flush=True)
            return
        evals = next((c for c in trainer.callbacks if isinstance(c, MBPPEval)), None)
        print(banner(model=_model(pl_module), train_tasks=len(getattr(data, "train_tasks", [])),
                     eval_tasks=evals.effective_num_questions if evals else None, steps=trainer.max_steps,
                     prompts_per_step=getattr(data, "prompts_per_step", 0), generations=described.group_size,
                     rewards=described.rewards, run=str(run_dir(trainer)),
                     dry_run=described.dry_run, mode=described.mode), flush=True)

    @rank_zero_only
    def on_fit_end(self, trainer, pl_module) -> None:
        from rlcode.callbacks.mbpp_eval import MBPPEval
        from rlcode.callbacks.metrics import GRPOMetrics
        from rlcode.callbacks.plots import TrainingPlots
        from rlcode.callbacks.shutdown import GracefulShutdown

        def find(kind):
            return next((c for c in trainer.callbacks if isinstance(c, kind)), None)

        from rlcode.callbacks.game_eval import GameEval

        metrics, evals, plots, shutdown = find(GRPOMetrics), find(MBPPEval), find(TrainingPlots), find(GracefulShutdown)
        games = find(GameEval)
        checkpoint = trainer.checkpoint_callback
        last = None
        if checkpoint is not None:
            last = checkpoint.last_model_path or checkpoint.best_model_path or None
        last = last or (shutdown.saved if shutdown else None)  # saved on the way out without a ModelCheckpoint
        dry_run = bool(getattr(pl_module.hparams, "dry_run", False))
        self.text = summarize(
            steps=trainer.global_step, seconds=time.perf_counter() - self._started,
            rewards=metrics.history if metrics else [], evals=evals.history if evals else [],
            run=str(run_dir(trainer)), checkpoint=None if dry_run else last,
            plot=str(plots.path) if plots and plots.path else None,
            interrupted=shutdown.requested if shutdown else None, game_evals=games.history if games else [],
            trajectories=metrics.trajectories if metrics else 0,
            successes=[(meaning, count) for meaning, count in metrics.successes.values()] if metrics else [],
            max_steps=trainer.max_steps, dry_run=dry_run, updates=metrics.updates if metrics else None,
            resume=resume_command(self.command))
        print("\n" + self.text, flush=True)
