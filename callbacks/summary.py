"""A short account at the end of ``fit``: what changed and where everything is."""

from __future__ import annotations

import math
import time

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from rlcode.callbacks.run_dir import run_dir


def summarize(steps: int, seconds: float, rewards: list[tuple[int, float]], evals: list[dict], run: str,
              checkpoint: str | None, plot: str | None, interrupted: str | None = None,
              game_evals: list[dict] | None = None, trajectories: int = 0, successful: int = 0) -> str:
    """The summary text (pure, so it can be tested without a trainer)."""
    lines = [f"rlcode fit {'stopped by ' + interrupted if interrupted else 'finished'}: {steps} optimizer steps "
             f"in {_duration(seconds)}"]
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
    if trajectories:  # ART's closing block: trajectories and success rates
        lines += ["", "Training complete!", f"  Total trajectories: {trajectories}",
                  f"  Successful: {successful} ({100 * successful / trajectories:.1f}%)", f"  Steps completed: {steps}"]
    return "\n".join(lines)


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
    def __init__(self) -> None:
        """Print what the run will do before it starts; afterwards steps, reward first vs last, pass
        rate before vs after, and where the run's files are."""
        self.text: str | None = None
        self._started = time.perf_counter()

    def on_fit_start(self, trainer, pl_module) -> None:
        self._started = time.perf_counter()

    @rank_zero_only
    def on_train_start(self, trainer, pl_module) -> None:
        from rlcode.callbacks.mbpp_eval import MBPPEval

        hp, data = pl_module.hparams, trainer.datamodule
        if hasattr(data, "games"):
            print(game_banner(model=_model(pl_module), games=data.games, steps=trainer.max_steps,
                              episodes_per_step=data.episodes_per_step, opponent=hp.get("opponent", "self"),
                              run=str(run_dir(trainer))), flush=True)
            return
        evals = next((c for c in trainer.callbacks if isinstance(c, MBPPEval)), None)
        # Modes whose episodes score themselves say what their reward is (multi-step MBPP, code game)
        rewards = getattr(pl_module, "reward_description", None) or list(hp.rewards)
        print(banner(model=_model(pl_module), train_tasks=len(getattr(data, "train_tasks", [])),
                     eval_tasks=evals.effective_num_questions if evals else None, steps=trainer.max_steps,
                     prompts_per_step=getattr(data, "prompts_per_step", 0), generations=hp.num_generations,
                     rewards=[rewards] if isinstance(rewards, str) else rewards, run=str(run_dir(trainer)),
                     dry_run=hp.dry_run, mode=type(pl_module).__name__), flush=True)

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
        self.text = summarize(
            steps=trainer.global_step, seconds=time.perf_counter() - self._started,
            rewards=metrics.history if metrics else [], evals=evals.history if evals else [],
            run=str(run_dir(trainer)), checkpoint=last, plot=str(plots.path) if plots and plots.path else None,
            interrupted=shutdown.requested if shutdown else None, game_evals=games.history if games else [],
            trajectories=metrics.trajectories if metrics else 0, successful=metrics.successful if metrics else 0)
        print("\n" + self.text, flush=True)
