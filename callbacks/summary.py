"""What the run will do, printed at fit start; a short account at fit end: what changed and where
everything is. Both read the module's ``run_description()`` and run history: the banner in
``on_fit_start``, before any callback's ``on_train_start`` (the first eval), and the account in
``on_fit_end``, after every train-end hook (the final eval, the last checkpoint, the plot)."""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Sequence

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from rlcode.run_dir import run_directory


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
           generations: int | None, rewards: list[str], run: str, dry_run: bool, mode: str = "GRPO") -> str:
    """What is about to happen, printed before the first step (the ART toolkit's header)."""
    rule = "=" * 60
    return "\n".join([
        f"rlcode {mode}{' (dry run: no weight updates)' if dry_run else ''}", rule,
        f"Model: {model}",
        f"Problems: {train_tasks} train" + (f", {eval_tasks} eval" if eval_tasks else ""),
        f"Steps: {steps}",
        f"Batch: {prompts_per_step} prompts" + (f" x {generations} generations" if generations else ""),
        f"Rewards: {' + '.join(rewards)}",
        f"Run dir: {run}", rule])


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
        self._print_banner(trainer, pl_module)

    @rank_zero_only
    def _print_banner(self, trainer, pl_module) -> None:
        described, data, run = pl_module.run_description(), trainer.datamodule, str(run_directory(trainer))
        if hasattr(data, "games"):
            print(game_banner(model=described.model, games=data.games, steps=trainer.max_steps,
                              episodes_per_step=data.episodes_per_step, opponent=described.opponent or "self",
                              run=run), flush=True)
            return
        print(banner(model=described.model, train_tasks=len(getattr(data, "train_tasks", [])),
                     eval_tasks=pl_module.history.eval_problems, steps=trainer.max_steps,
                     prompts_per_step=getattr(data, "prompts_per_step", 0), generations=described.group_size,
                     rewards=described.rewards, run=run, dry_run=described.dry_run, mode=described.mode), flush=True)

    @rank_zero_only
    def on_fit_end(self, trainer, pl_module) -> None:
        history, described = pl_module.history, pl_module.run_description()
        checkpoint = trainer.checkpoint_callback
        last = None
        if checkpoint is not None:
            last = checkpoint.last_model_path or checkpoint.best_model_path or None
        last = last or history.saved_on_stop  # saved on the way out without a ModelCheckpoint
        self.text = summarize(
            steps=trainer.global_step, seconds=time.perf_counter() - self._started, rewards=history.rewards(),
            evals=history.evals, run=str(run_directory(trainer)), checkpoint=None if described.dry_run else last,
            plot=history.plot, interrupted=history.stopped_by, game_evals=history.game_evals,
            trajectories=history.trajectories(),
            successes=[(c.meaning, c.count) for c in history.successes(described.success_labels)],
            max_steps=trainer.max_steps, dry_run=described.dry_run, updates=history.updates(),
            resume=resume_command(self.command))
        print("\n" + self.text, flush=True)
