"""Score the current policy on MBPP tasks: greedy pass@1 and, optionally, sampled pass@k.

Completions come from the module's own rollout backend (same prompts, stop strings and chat
template as training); programs run in a sandbox pool against the task's asserts, judged by
``rlcode.sandbox.verdict.check_program``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlcode.data.mbpp import MBPPTask


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

    @property
    def problems_passed(self) -> int:
        return sum(p.passed for p in self.problems)

    @property
    def pass_rate(self) -> float:
        return self.problems_passed / len(self.problems) if self.problems else 0.0

    def metrics(self) -> dict[str, float]:
        metrics = {"mbpp_eval/pass_rate": self.pass_rate, "mbpp_eval/problems_passed": float(self.problems_passed)}
        metrics.update({f"mbpp_eval/{name}": value for name, value in self.pass_at_k.items()})
        return metrics

    def as_json(self) -> dict:
        return {"step": self.step, "split": self.split, "num_questions": len(self.problems),
                "pass_rate": self.pass_rate, "problems_passed": self.problems_passed,
                "sample_temperature": self.temperature, **self.pass_at_k,
                "problems": [asdict(p) for p in self.problems]}


def score_policy(module, tasks: list[MBPPTask], prompt_format: str, pool, *, step: int, split: str,
                 num_samples: int, ks: list[int], temperature: float, max_new_tokens: int, timeout: float,
                 batch_size: int) -> EvalReport:
    """Greedy pass@1 on every task, plus pass@k from ``num_samples`` samples at ``temperature``."""
    from rlcode.data.prompts import build_prompt
    from rlcode.eval.passk import mean_pass_at_k

    prompts = [module.render(build_prompt(task, prompt_format)) for task in tasks]
    greedy = _generate(module, prompts, 1, 0.0, max_new_tokens, batch_size, seed=step)
    greedy_verdicts = _check_all(pool, tasks, greedy, 1, timeout)
    problems = [ProblemResult(task.task_id, verdict.all_passed, _describe(verdict), completion)
                for task, completion, verdict in zip(tasks, greedy, greedy_verdicts)]
    pass_at_k = {}
    if num_samples > 0:
        sampled = _generate(module, prompts, num_samples, temperature, max_new_tokens,
                            max(1, batch_size // num_samples), seed=step + 1)
        verdicts = _check_all(pool, tasks, sampled, num_samples, timeout)
        counts = {}
        for index, problem in enumerate(problems):
            rows = range(index * num_samples, (index + 1) * num_samples)
            problem.samples = num_samples
            problem.samples_passed = sum(verdicts[i].all_passed for i in rows)
            problem.sample_completions = [sampled[i] for i in rows]
            counts[problem.task_id] = (num_samples, problem.samples_passed)
        pass_at_k = mean_pass_at_k(counts, ks)
    return EvalReport(step, split, temperature, problems, pass_at_k)


def _generate(module, prompts: list[str], per_prompt: int, temperature: float, max_new_tokens: int,
              prompts_per_batch: int, seed: int) -> list[str]:
    texts: list[str] = []
    for start in range(0, len(prompts), prompts_per_batch):
        rollout = module.generate(prompts[start:start + prompts_per_batch], per_prompt, temperature=temperature,
                                  max_new_tokens=max_new_tokens, seed=seed + start)
        texts.extend(rollout.completion_texts)
    return texts


def _check_all(pool, tasks: list[MBPPTask], completions: list[str], per_task: int, timeout: float) -> list:
    from rlcode.rewards.extraction import extract_code
    from rlcode.sandbox.verdict import check_program

    futures = []
    for index, completion in enumerate(completions):
        task = tasks[index // per_task]
        code = extract_code(completion, task.entry_point)
        futures.append(check_program(pool, code, list(task.test_list), setup=task.test_setup_code, timeout=timeout,
                                     tags={"run": "mbpp-eval", "task": str(task.task_id)}))
    return [future.result() for future in futures]


def _describe(verdict) -> str:
    if verdict.all_passed:
        return "passed"
    passed = sum(bool(p) for p in verdict.passed)
    reason = f": {verdict.reason}" if getattr(verdict, "reason", None) else ""
    return f"failed ({passed}/{len(verdict.passed)} asserts){reason}"
