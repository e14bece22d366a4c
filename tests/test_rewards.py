"""Code extraction and the sandbox rewards (TRL calling convention, schedule, never raising)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from rlcode.rewards import (REWARDS, ExecutionReward, MBPPTestsFraction, MBPPTestsPassed,
                            build_reward, extract_code, entry_point_of)
from rlcode.sandbox import SandboxPool
from rlcode.sandbox.result import ExecResult, Status

FENCE = "```"


# -- extraction --------------------------------------------------------------------------------

def test_extract_fenced_python_block():
    text = f"Here you go:\n{FENCE}python\ndef f(x):\n    return x\n{FENCE}\nDone."
    assert extract_code(text) == "def f(x):\n    return x"


@pytest.mark.parametrize("tag", ["py", "", "python3", "Python"])
def test_extract_other_fence_tags(tag):
    assert extract_code(f"{FENCE}{tag}\nx = 1\n{FENCE}") == "x = 1"


def test_non_python_blocks_are_skipped():
    text = f"{FENCE}bash\npip install x\n{FENCE}\n{FENCE}python\ny = 2\n{FENCE}"
    assert extract_code(text) == "y = 2"


def test_unclosed_fence_runs_to_the_end():
    assert extract_code(f"{FENCE}python\ndef f():\n    return 1\n") == "def f():\n    return 1"


def test_begin_done_format():
    assert extract_code("[BEGIN]\ndef f(): return 1\n[DONE]\nmore text") == "def f(): return 1"
    assert extract_code("[BEGIN] x = 1") == " x = 1"


# What a base model writes after the MBPP paper's prompt (which ends in "[BEGIN]\n"): its answer, then
# [DONE], then it goes on with a task of its own and that task's [BEGIN]...[DONE] span.
BASE_MODEL_COMPLETION = (
    "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n"
    "  return (res) \n[DONE]\n\nYou are an expert Python programmer, and here is your task: Write a "
    "function to find the maximum of two numbers. Your code should pass these tests:\n\n"
    "assert maximum(5,10) == 10\n[BEGIN]\ndef maximum(a,b):\n  return max(a, b)\n[DONE]\n"
)


def test_base_model_answer_is_cut_at_its_first_done():
    """The answer to a prompt ending in [BEGIN] is what precedes the first [DONE].
    Before, the text after [DONE] was kept (a syntax error) or the model's own next task was taken."""
    code = extract_code(BASE_MODEL_COMPLETION, entry_point="similar_elements")
    assert code.startswith("def similar_elements(") and code.rstrip().endswith("return (res)")
    compile(code, "<completion>", "exec")
    assert extract_code("def f():\n    return 1\n[DONE]\nand then some prose") == "def f():\n    return 1"


def test_the_program_is_what_comes_first_whichever_marker():
    """A base model's answer, [DONE], then prose with a fenced block: the answer is the program, not
    the fenced text (before, any fenced block won). And a fence that comes first wins over a later
    [BEGIN]...[DONE] span; a span holding a fence stands for its Python block."""
    code = "def add(a, b):\n    return a + b"
    answer = f"{code}\n[DONE]\nExplanation: it adds.\n{FENCE}\nfoo bar\n{FENCE}\nfoo bar"
    assert extract_code(answer, "add") == code and extract_code(answer) == code
    assert extract_code(f"{code}\n[DONE]\n{FENCE}python\nx = 1\n{FENCE}") == code
    assert extract_code(f"{FENCE}python\n{code}\n{FENCE}\n[DONE]\n[BEGIN]\nfoo bar\n[DONE]") == code
    assert extract_code(f"Text.\n[BEGIN]\n{FENCE}python\n{code}\n{FENCE}\n[DONE]") == code
    assert extract_code(f"[BEGIN]\n{code}\n[DONE]\n{FENCE}python\nfoo bar\n{FENCE}") == code


def test_plain_prompt_format_stops_at_done():
    """With model.stop unset, generation stops at the prompt format's stop strings
    ([DONE] for the MBPP paper's format, the closing fence for chat); an explicit stop wins."""
    from types import SimpleNamespace

    from rlcode.modes import GRPO

    from grpo_harness import learner

    module = learner(GRPO, model_name="tiny-random")
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(prompt_format="plain"))
    assert module.stop_strings() == ["[DONE]"]
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(prompt_format="chat"))
    assert "\n```\n" in module.stop_strings()
    assert learner(GRPO, model_name="tiny-random", stop=["END"]).stop_strings() == ["END"]


def test_a_reward_function_returning_none_leaves_the_others_in_the_total():
    """As TRL's nansum, a None from one function does not make the total NaN; NaN
    only when every function returned None."""
    import math

    from rlcode.rewards.mixture import RewardMixture

    def first(prompts, completions, **columns):
        return [None, 1.0, None]

    def second(prompts, completions, **columns):
        return [0.5, None, None]

    outcome = RewardMixture([first, second], [2.0, 1.0]).start(["p"] * 3, ["a", "b", "c"]).result()
    assert outcome.total[:2] == [0.5, 2.0] and math.isnan(outcome.total[2])


def test_raw_text_is_the_code():
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1"


def test_prefers_the_block_that_defines_the_entry_point():
    text = (f"{FENCE}python\nprint(add(1, 2))\n{FENCE}\n"
            f"{FENCE}python\ndef helper(): pass\n{FENCE}\n"
            f"{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}")
    assert extract_code(text, "add") == "def add(a, b):\n    return a + b"
    assert extract_code(text) == "def helper(): pass"  # no entry point: first block with a def


def test_chat_messages_are_accepted():
    messages = [{"role": "assistant", "content": f"{FENCE}py\nz = 3\n{FENCE}"}]
    assert extract_code(messages) == "z = 3"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "q = 4"}]}]
    assert extract_code(parts) == "q = 4"


def test_entry_point_of_tests():
    assert entry_point_of(["assert set(find(1)) == {1}"]) == "find"
    assert entry_point_of(["assert math.isclose(area(2), 3.0)"]) == "area"
    assert entry_point_of(["assert sum(10, 15) == 6"]) == "sum"  # MBPP task 126
    assert entry_point_of([]) is None


# -- rewards with a real pool ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, timeout=5.0) as pool:
        yield pool


def test_execution_reward_schedule(pool):
    reward = ExecutionReward(pool=pool)
    completions = ["print('hi')", "x = 1", "def f(:\n", "if True:\nprint(1)", "1 / 0",
                   "import time\ntime.sleep(60)", "", f"{FENCE}python\nprint(2)\n{FENCE}"]
    reward.timeout = 4.0  # generous: a loaded machine must not turn `1 / 0` into a timeout
    scores = reward(prompts=["p"] * len(completions), completions=completions)
    assert scores == [1.0, 0.5, -0.5, -0.5, -1.0, -1.0, -0.5, 1.0]
    assert reward.last_details[4] == "error: ZeroDivisionError" and reward.last_details[5] == "timeout"
    metrics = reward.last_metrics
    assert metrics["successful_predictions_count"] == 3 and metrics["internal_errors"] == 0
    assert metrics["status/timeout"] == 1 and metrics["mean"] == pytest.approx(sum(scores) / 8)


def test_mbpp_rewards_with_trl_columns(pool):
    tests = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 4"]
    completions = [
        f"{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}",
        "def add(a, b):\n    return a * b",  # passes only 2 + 2 == 4 and 0 * 0 == 0
        [{"role": "assistant", "content": "I cannot."}],
    ]
    columns = {"test_list": [tests] * 3, "test_setup_code": [""] * 3, "task_id": [7, 7, 7]}
    passed = MBPPTestsPassed(pool=pool)
    assert passed(["p"] * 3, completions, **columns) == [1.0, 0.0, 0.0]
    assert passed.last_details[0] == "passed"
    assert passed.last_details[1] == "assert 1 failed: got 2, expected 3"
    assert passed.last_metrics["successful_predictions_count"] == 1
    fraction = MBPPTestsFraction(pool=pool)
    assert fraction(["p"] * 3, completions, **columns) == [1.0, pytest.approx(2 / 3), 0.0]


def test_setup_code_column_is_used(pool):
    tests = ["assert f() == math.pi"]
    reward = MBPPTestsPassed(pool=pool)
    code = "def f():\n    import math\n    return math.pi"
    assert reward(None, [code], test_list=[tests], test_setup_code=["import math"]) == [1.0]


def test_start_returns_before_the_work_is_done(pool):
    reward = ExecutionReward(pool=pool)
    job = reward.start(["p"], ["import time\ntime.sleep(0.5)\nprint(1)"])
    assert not job.done()
    assert job.result() == [1.0] and job.done()


# -- never raising, tags ------------------------------------------------------------------------

class RecordingPool:
    """Stands in for SandboxPool: records submissions, answers with a fixed status."""

    def __init__(self, status=Status.OK, fail_submit=False):
        self.status, self.fail_submit, self.submitted = status, fail_submit, []

    def submit(self, program, *, timeout=None, tags=None, reference=False):
        if self.fail_submit:
            raise RuntimeError("SandboxPool is closed; create a new pool")
        self.submitted.append((program, dict(tags or {})))
        future = Future()
        future.set_result(ExecResult(exec_id="x", status=self.status, returncode=0, stdout="out\n",
                                     stderr="", stdout_truncated=False, stderr_truncated=False,
                                     duration_s=0.0, tags=dict(tags or {}), probe_lines=[]))
        return future


class _State:
    global_step = 12


def test_tags_carry_run_step_and_task():
    fake = RecordingPool()
    reward = ExecutionReward(pool=fake, run_id="abc", tags={"model": "tiny"})
    reward(["p", "p"], ["print(1)", "print(2)"], task_id=[601, 602], trainer_state=_State())
    assert [tags for _, tags in fake.submitted] == [
        {"model": "tiny", "run": "abc", "step": "12", "task": "601"},
        {"model": "tiny", "run": "abc", "step": "12", "task": "602"}]


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_a_broken_pool_gives_the_lowest_reward_and_counts_it(name):
    reward = build_reward(name, pool=RecordingPool(fail_submit=True))
    scores = reward(["p"] * 2, ["print(1)", "x"], test_list=[["assert f() == 1"]] * 2)
    assert scores == [reward.lowest] * 2
    assert reward.last_metrics["internal_errors"] == 2
    assert all(d.startswith("internal_error") for d in reward.last_details)


def test_internal_error_status_counts_as_internal():
    reward = ExecutionReward(pool=RecordingPool(status=Status.INTERNAL_ERROR))
    assert reward(["p"], ["print(1)"]) == [-1.0]
    assert reward.last_metrics["internal_errors"] == 1


def test_missing_tests_column_is_an_internal_error_not_an_exception():
    reward = MBPPTestsPassed(pool=RecordingPool())
    assert reward(["p"], ["def f(): pass"]) == [0.0]
    assert "test_list" in reward.last_details[0] and reward.last_metrics["internal_errors"] == 1


def test_a_test_column_of_another_name_warns_once_naming_the_columns():
    reward = MBPPTestsPassed(pool=RecordingPool())
    rows = {"task_id": [1, 2], "test_cases": [["assert f() == 1"], ["assert f() == 2"]]}  # ART's name
    with pytest.warns(UserWarning, match=r"no 'test_list' column \(columns: task_id, test_cases\)") as caught:
        assert reward(["p", "q"], ["def f(): return 1"] * 2, **rows) == [0.0, 0.0]
        reward(["p"], ["def f(): return 1"], task_id=[3], test_cases=[["assert f() == 1"]])
    assert len([w for w in caught if "test_list" in str(w.message)]) == 1


def test_registry():
    assert set(REWARDS) == {"execution", "mbpp_tests", "mbpp_tests_fraction", "mbpp_hidden_tests",
                            "mbpp_hidden_tests_fraction"}
    reward = build_reward("mbpp_tests_fraction", pool=RecordingPool())
    assert reward.__name__ == "mbpp_tests_fraction"
    with pytest.raises(ValueError, match="unknown reward"):
        build_reward("nope")
