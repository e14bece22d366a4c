"""``rlcode-eval --generate``: sample MBPP completions from a served model into a samples file.

The prompts are the trainer's (``rlcode.data.prompts``): ``chat`` messages go to the server's chat
endpoint (its own chat template applies), the ``plain`` MBPP-paper text to its completions endpoint.
The file is then scored like any other samples file, so one command samples and scores.
Standard library and the HTTP client only: no torch, no tokenizer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rlcode.data.mbpp import MBPPTask
from rlcode.data.prompts import STOP_SEQUENCES, build_prompt
from rlcode.rollout.openai.client import OpenAIClient, OpenAISettings, SampleRequest


def write_served_samples(path: Path, tasks: Sequence[MBPPTask], settings: OpenAISettings, *, num_samples: int,
                         temperature: float, max_tokens: int, prompt_format: str, seed: int = 0) -> int:
    """Sample ``num_samples`` completions per task and write one ``{"task_id", "completion", ...}``
    line each to ``path``; returns the number of lines. Sample j of task i gets seed ``seed + i*n + j``."""
    client = OpenAIClient(settings)
    requests = [SampleRequest(prompt=build_prompt(task, prompt_format), max_tokens=max_tokens,
                              temperature=temperature, stop=tuple(STOP_SEQUENCES[prompt_format]),
                              seed=seed + index * num_samples + sample)
                for index, task in enumerate(tasks) for sample in range(num_samples)]
    model = client.model()  # checked against /v1/models before anything is sampled
    print(f"rlcode-eval: sampling {len(requests)} completions of {len(tasks)} tasks from {model} at "
          f"{client.base_url}", file=sys.stderr)
    completions = client.complete(requests)
    with open(path, "w", encoding="utf-8") as out:
        for number, completion in enumerate(completions):
            task = tasks[number // num_samples]
            out.write(json.dumps({"task_id": task.task_id, "completion": completion.text, "model": model,
                                  "sample": number % num_samples, "finish_reason": completion.finish_reason}) + "\n")
    return len(completions)
