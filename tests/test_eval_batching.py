"""The eval batch size sets speed only: greedy completions, verdicts and the report's order are those
of batch 1, and each batch prints a progress line."""

from __future__ import annotations

import pytest

from rlcode.data.mbpp import load_mbpp
from rlcode.data.prompts import build_prompt
from rlcode.eval.progress import EvalProgress
from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt

from mbpp_location import mbpp_file


def mbpp_prompts(tokenizer, count: int) -> list[str]:
    """Validation prompts plus two short ones: a chat prompt of a few words beside MBPP's 100-400
    token ones is about the most padding a batch can have."""
    tasks = load_mbpp(str(mbpp_file()), split="validation")[:count]
    texts = [build_prompt(task, "chat") for task in tasks] + ["hi", "def add(a, b):"]
    return [render_prompt(tokenizer, text, chat=True) for text in texts]


def completions_in_batches(backend, prompts, size: int, limit: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_new_tokens=limit, stop=["\n```\n"])
    tokens = []
    for start in range(0, len(prompts), size):
        batch = backend.generate(prompts[start:start + size], 1, params)
        tokens += [batch.completion_ids[row][batch.completion_mask[row].bool()].tolist() for row in range(len(batch))]
    return tokens


def assert_same_at_every_size(name: str, count: int, sizes: tuple[int, ...], limit: int) -> None:
    tokenizer = load_tokenizer(name)
    backend = HFGenerateBackend(load_model(name).eval(), tokenizer)
    prompts = mbpp_prompts(tokenizer, count)
    lengths = {len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts}
    assert max(lengths) > 5 * min(lengths)  # the batches are padded, heavily for the short prompts
    one = completions_in_batches(backend, prompts, 1, limit)
    ended = [len(tokens) < limit for tokens in one]
    assert any(ended) and not all(ended)  # rows leave the batch early while others go on decoding
    for size in sizes:
        assert completions_in_batches(backend, prompts, size, limit) == one, f"batch {size} differs from batch 1"


def test_greedy_tokens_do_not_depend_on_the_batch_size():
    assert_same_at_every_size("tiny-random", count=10, sizes=(3, 12), limit=40)


@pytest.mark.integration
def test_greedy_tokens_of_smollm2_do_not_depend_on_the_batch_size():
    assert_same_at_every_size("smollm2-135m-instruct", count=4, sizes=(6,), limit=48)


def test_the_report_is_the_same_at_any_batch_size_and_prints_a_line_per_batch():
    from rlcode.modes import GRPO
    from grpo_harness import learner
    from rlcode.eval.policy_scoring import score_policy

    module = learner(GRPO, model_name="tiny-random", max_new_tokens=24)
    module.configure_model()
    tasks = load_mbpp(str(mbpp_file()), split="validation")[:5]
    prompts = [module.render(build_prompt(task, "chat")) for task in tasks]
    reports, lines = {}, {}
    with module.sandbox_pool(5.0) as pool:
        for size in (1, 2, 16):
            lines[size] = []
            progress = EvalProgress("MBPP test", len(tasks), say=lines[size].append)
            reports[size] = score_policy(module, prompts, tasks, pool, step=0, split="validation", max_new_tokens=24,
                                         timeout=5.0, batch_size=size, progress=progress).as_json()
    assert [p["task_id"] for p in reports[1]["problems"]] == [t.task_id for t in tasks]  # the split's order
    assert reports[2] == reports[16] == reports[1]
    assert [len(lines[size]) for size in (1, 2, 16)] == [5, 3, 1]
    assert lines[2][0].startswith("  MBPP test: 2/5 problems, pass rate 0.000 (0/2), ")
    assert lines[2][-1].startswith("  MBPP test: 5/5 problems, pass rate 0.000 (0/5), ")
    assert lines[2][-1].endswith(" problems/s")


def test_progress_counts_passes_and_can_leave_the_last_line_to_its_caller():
    lines = []
    progress = EvalProgress("MBPP eval at step 3 (validation)", 4, say=lines.append, last_line=False)
    progress.add([True, False, False])
    progress.add([True])
    assert len(lines) == 1 and lines[0].startswith("  MBPP eval at step 3 (validation): 3/4 problems, pass rate 0.333 (1/3)")
    assert (progress.done, progress.passed) == (4, 2) and progress.problems_per_second > 0
    unknown = EvalProgress("MBPP validate", None, say=lines.append)
    unknown.add([True])
    assert lines[-1].startswith("  MBPP validate: 1 problems, pass rate 1.000 (1/1), ")


def test_a_batch_size_below_one_is_refused():
    from rlcode.eval.policy_scoring import score_policy

    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        score_policy(None, ["p"], [], None, step=0, split="validation", max_new_tokens=4, timeout=1.0, batch_size=0)
