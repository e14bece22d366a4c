"""Score the current policy on MBPP problems: greedy pass@1 and, optionally, sampled pass@k.

The one scorer of the project: the MBPP eval callback (initial / interval / final evals during fit)
and ``rlcode validate`` / ``rlcode test`` (``GRPO.validation_step``) both call ``score_policy``.
Completions come from the module's own rollout backend (same prompts, stop strings and chat
template as training); programs run in a sandbox pool against the problem's asserts, judged by
``rlcode.sandbox.verdict.check_against_tests``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, Sequence

from rlcode.data.humaneval import program_for
from rlcode.data.prompts import length_order
from rlcode.eval.passk import mean_pass_at_k
from rlcode.eval.progress import EvalProgress
from rlcode.eval.settings import EvalSettings
from rlcode.sandbox.verdict import check_against_tests
from rlcode.stopping import Stopped

# The benchmarks an eval scores (``eval.benchmark``, ``rlcode-eval --benchmark``), with the names
# progress lines show; a report's metrics are "<benchmark>_eval/...".
BENCHMARK_NAMES = {"mbpp": "MBPP", "humaneval": "HumanEval"}


class Problem(Protocol):
    """What scoring needs of a problem (an ``MBPPTask`` is one)."""

    task_id: int
    test_list: Sequence[str]
    test_setup_code: str
    entry_point: str | None


@dataclass(frozen=True)
class BatchProblem:
    """A problem rebuilt from the DataModule's batch columns (``rlcode validate`` / ``test``)."""

    task_id: int
    test_list: Sequence[str]
    test_setup_code: str = ""
    entry_point: str | None = None
    program_prefix: str | None = None  # HumanEval's prompt (see rlcode.data.humaneval.program_for)


@dataclass
class ProblemResult:
    task_id: int
    passed: bool
    """The greedy completion passed every assert."""
    verdict: str
    completion: str
    samples: int = 0
    samples_passed: int = 0
    sample_completions: list[str] = field(default_factory=list)


@dataclass
class EvalReport:
    step: int
    split: str
    temperature: float
    problems: list[ProblemResult]
    pass_at_k: dict[str, float] = field(default_factory=dict)
    benchmark: str = "mbpp"  # names the metrics: "<benchmark>_eval/pass_rate", ...
    settings: dict = field(default_factory=dict)  # rlcode.eval.settings.EvalSettings.as_json()
    rollout_precision: str = "same"  # the sampler of the completions: "same" (the policy) or "int8"

    @property
    def problems_passed(self) -> int:
        return sum(p.passed for p in self.problems)

    @property
    def pass_rate(self) -> float:
        return self.problems_passed / len(self.problems) if self.problems else 0.0

    def metrics(self) -> dict[str, float]:
        prefix = f"{self.benchmark}_eval"
        metrics = {f"{prefix}/pass_rate": self.pass_rate, f"{prefix}/problems_passed": float(self.problems_passed)}
        metrics.update({f"{prefix}/{name}": value for name, value in self.pass_at_k.items()})
        return metrics

    def as_json(self) -> dict:
        return {"step": self.step, "benchmark": self.benchmark, "split": self.split,
                "num_questions": len(self.problems),
                "pass_rate": self.pass_rate, "problems_passed": self.problems_passed,
                "sample_temperature": self.temperature, "rollout_precision": self.rollout_precision,
                **self.pass_at_k, "generation": self.settings,
                "problems": [asdict(p) for p in self.problems]}


def score_policy(module, prompts: list[str], problems: Sequence[Problem], pool, *, step: int, split: str,
                 num_samples: int = 0, ks: Sequence[int] = (), temperature: float = 0.0, max_new_tokens: int,
                 timeout: float, batch_size: int, progress: EvalProgress | None = None,
                 benchmark: str = "mbpp", should_stop: Callable[[], bool] | None = None,
                 rollout_precision: str = "same") -> EvalReport:
    """Greedy pass@1 on every problem, plus pass@k from ``num_samples`` samples at ``temperature``.

    ``prompts`` are rendered (one per problem); ``batch_size`` prompts of similar length are
    generated together, and each batch is checked before the next one is generated, so ``progress``
    can report it. Greedy completions do not depend on the batch size or on which prompts share a
    batch (``tests/test_eval_batching.py``): both set speed only. The report lists the problems in
    the order given.

    ``should_stop`` is asked before each batch is generated (greedy, then sampled); when it says yes,
    ``rlcode.stopping.Stopped`` is raised and the partial results are dropped (nothing can pass them
    for a finished eval): a stop waits for one batch at most. Under DDP it must give every rank the
    same answer at the same batch (``StopToken.agreed`` at ``StopPoint.EVAL_BATCH``).

    ``rollout_precision`` picks the sampler ("same": the policy in full precision, also when training
    samples from int8; "int8": the hf backend's int8 copy); the report records it.
    """
    if batch_size < 1:
        raise ValueError(f"eval batch_size must be >= 1, got {batch_size}")
    results: list[ProblemResult | None] = [None] * len(prompts)
    order = length_order(prompts)  # batches of similar lengths, padded little; results stay in order
    stop = _stopper(should_stop, len(prompts))
    for start in range(0, len(order), batch_size):
        stop(start)
        chosen = order[start:start + batch_size]
        batch_problems = [problems[i] for i in chosen]
        greedy = _generate(module, [prompts[i] for i in chosen], 1, 0.0, max_new_tokens, batch_size, seed=step + start,
                           precision=rollout_precision)
        verdicts = _check_all(pool, batch_problems, greedy, 1, timeout)
        for index, problem, completion, verdict in zip(chosen, batch_problems, greedy, verdicts):
            results[index] = ProblemResult(problem.task_id, verdict.all_passed, _describe(verdict), completion)
        if progress is not None:
            progress.add(verdict.all_passed for verdict in verdicts)
    pass_at_k = {}
    if num_samples > 0:
        sampled = _generate(module, prompts, num_samples, temperature, max_new_tokens,
                            max(1, batch_size // num_samples), seed=step + 1, stop=stop, precision=rollout_precision)
        verdicts = _check_all(pool, problems, sampled, num_samples, timeout)
        counts = {}
        for index, result in enumerate(results):
            rows = range(index * num_samples, (index + 1) * num_samples)
            result.samples = num_samples
            result.samples_passed = sum(verdicts[i].all_passed for i in rows)
            result.sample_completions = [sampled[i] for i in rows]
            counts[result.task_id] = (num_samples, result.samples_passed)
        pass_at_k = mean_pass_at_k(counts, list(ks))
    return EvalReport(step, split, temperature, results, pass_at_k, benchmark, rollout_precision=rollout_precision)


def score_batch(module, batch: dict, pool, *, split: str, settings: EvalSettings,
                progress: EvalProgress | None = None) -> EvalReport:
    """A DataModule batch (``rlcode validate`` / ``test``) scored as the fit-time eval scores:
    ``settings`` are the eval callback's (token limit, sampling, timeout), its prompts and columns
    generated together (the batch is ``settings.batch_size``). A batch with a ``program_prefix``
    column is HumanEval's (``eval.benchmark: humaneval``)."""
    count = len(batch["task_id"])
    problems = [BatchProblem(*row) for row in zip(batch["task_id"], batch["test_list"],
                                                  batch.get("test_setup_code") or [""] * count,
                                                  batch.get("entry_point") or [None] * count,
                                                  batch.get("program_prefix") or [None] * count)]
    prompts = [module.render(prompt) for prompt in batch["prompt"]]
    report = score_policy(module, prompts, problems, pool, step=module.global_step, split=split,
                          num_samples=settings.num_samples, ks=settings.k, temperature=settings.temperature,
                          max_new_tokens=settings.max_new_tokens, timeout=settings.timeout,
                          batch_size=len(prompts), progress=progress,
                          benchmark="humaneval" if batch.get("program_prefix") else "mbpp")
    report.settings = settings.as_json()
    return report


def _stopper(should_stop: Callable[[], bool] | None, total: int) -> Callable[[int], None]:
    """Raises ``Stopped`` when ``should_stop`` says so; called with the problems done so far."""
    def stop(done: int) -> None:
        if should_stop is not None and should_stop():
            raise Stopped(f"stopped after {done} of {total} problems")
    return stop


def _generate(module, prompts: list[str], per_prompt: int, temperature: float, max_new_tokens: int,
              prompts_per_batch: int, seed: int, stop: Callable[[int], None] = lambda done: None,
              precision: str = "same") -> list[str]:
    texts: list[str] = []
    for start in range(0, len(prompts), prompts_per_batch):
        stop(len(prompts))  # the greedy pass is done; the sampled one is not (so: all but finished)
        rollout = module.generate(prompts[start:start + prompts_per_batch], per_prompt, temperature=temperature,
                                  max_new_tokens=max_new_tokens, seed=seed + start, precision=precision)
        texts.extend(rollout.completion_texts)
    return texts


def _check_all(pool, problems: Sequence[Problem], completions: list[str], per_task: int, timeout: float) -> list:
    futures = []
    for index, completion in enumerate(completions):
        problem = problems[index // per_task]
        code = program_for(problem, completion)
        futures.append(check_against_tests(pool, code, list(problem.test_list), setup=problem.test_setup_code or "",
                                           timeout=timeout, tags={"run": "mbpp-eval", "task": str(problem.task_id)}))
    return [future.result() for future in futures]


def _describe(verdict) -> str:
    if verdict.all_passed:
        return "passed"
    passed = sum(bool(p) for p in verdict.passed)
    reason = f": {verdict.reason}" if getattr(verdict, "reason", None) else ""
    return f"failed ({passed}/{len(verdict.passed)} asserts){reason}"
