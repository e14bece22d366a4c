"""The OpenAI-compatible backend against a real server: llama.cpp's (``llama-cpp-python[server]``)
serving the embedded SmolLM2 GGUF on 127.0.0.1, started once for this module.

Optional: skipped with the reason when llama_cpp is not installed (``pip install 'rlcode[serve]'``
builds it from source, about 7 minutes on 2 cores; CI does not). Nothing here leaves the loopback.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_code_game_predictions import ScriptedLearner, pool  # noqa: F401  (the sandbox fixture)

pytestmark = [pytest.mark.served, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2"  # the alias the server is started with
STARTUP_SECONDS = 180
MBPP_BASE = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml")]
SPIRAL_BASE = ["--config", str(REPO / "configs/spiral_tictactoe.yaml"), "--config", str(REPO / "configs/tiny_test.yaml")]

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python[server] is not installed: `pip install 'rlcode[serve]'` (builds from source, "
                "~7 min) to run the real-server tests", allow_module_level=True)


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The base URL of a llama.cpp server on 127.0.0.1 serving SmolLM2-135M-Instruct (Q4_1) as ``smollm2``."""
    from rlcode.models.embedded_smollm2 import smollm2_gguf

    folder = tmp_path_factory.mktemp("served")
    gguf = smollm2_gguf(folder / "gguf")
    port = _free_loopback_port()
    log = open(folder / "server.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL,
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "2"],
        stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while True:  # bounded: the deadline, or the process dying
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {process.returncode}: "
                            f"{(folder / 'server.log').read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(base_url + "/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within {STARTUP_SECONDS}s")
            time.sleep(0.5)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def settings(server: str, **extra):
    from rlcode.rollout.openai.client import OpenAISettings

    return OpenAISettings(base_url=server, model=MODEL, max_concurrency=2, timeout=120, **extra)


def test_chat_groups_with_token_counts_and_logprobs(server):
    from rlcode.rollout import SamplingParams
    from rlcode.rollout.openai.backend import OpenAIBackend
    from rlcode.rollout.rendering import ChatPrompt

    backend = OpenAIBackend(settings(server))
    prompts = [ChatPrompt("What is 2 + 2?"), ChatPrompt([{"role": "user", "content": "Name a colour."}])]
    batch = backend.generate(prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=8, seed=3))
    assert len(batch) == 4 and all(isinstance(text, str) for text in batch.completion_texts)
    lengths = batch.completion_mask.sum(dim=1).tolist()
    assert all(1 <= n <= 8 for n in lengths), lengths
    assert all(n == 8 for n, cut in zip(lengths, batch.truncated.tolist()) if cut)  # "length" = hit the limit
    assert batch.sampling_logps is not None  # llama.cpp gives the sampled tokens' log-probs (not their ids)
    kept = batch.sampling_logps[batch.completion_mask.bool()]
    assert all(math.isfinite(v) and v <= 0 for v in kept.tolist())
    assert "token ids" not in backend.training_unsupported_reason()  # chat: the template is the server's

    greedy = backend.generate(prompts[:1], 2, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert greedy.completion_texts[0] == greedy.completion_texts[1] and greedy.completion_texts[0]


def test_completions_with_the_trainers_rendered_prompt(server):
    from rlcode.rollout import SamplingParams
    from rlcode.rollout.openai.backend import OpenAIBackend

    backend = OpenAIBackend(settings(server, api="completions"))
    rendered = "<|im_start|>user\nWrite a Python function add(a, b).<|im_end|>\n<|im_start|>assistant\n"
    batch = backend.generate([rendered], 1, SamplingParams(temperature=0.0, max_new_tokens=24, stop=["\n```\n"]))
    assert batch.completion_texts[0].strip() and int(batch.completion_mask.sum()) >= 1
    assert "token ids" in backend.training_unsupported_reason()  # llama.cpp returns token text, not ids
    with pytest.raises(Exception, match="did not return token ids"):
        OpenAIBackend(settings(server, api="completions", token_ids=True)).generate(
            [rendered], 1, SamplingParams(max_new_tokens=2))


def test_a_wrong_model_name_lists_what_the_real_server_serves(server):
    from rlcode.rollout.openai.client import OpenAIClient, OpenAISettings, ServedModelError

    with pytest.raises(ServedModelError, match=f"model 'gpt-4o' is not served at .*; it serves: {MODEL}"):
        OpenAIClient(OpenAISettings(base_url=server, model="gpt-4o")).model()


def test_dry_run_fit_loads_no_local_model(server, tmp_path, capsys, monkeypatch):
    """ART's ``--dry-run --use-openai``: rollouts from the served model, rewards in the sandbox, no update,
    and neither weights nor a tokenizer loaded locally."""
    import rlcode.models as models
    from rlcode.cli.command import main

    def refuse(*args, **kwargs):
        raise AssertionError("the served dry run loaded a local model")

    monkeypatch.setattr(models, "load_model", refuse)
    monkeypatch.setattr(models, "load_tokenizer", refuse)
    main(["fit", *MBPP_BASE, "--run.root_dir", str(tmp_path), "--model.dry_run", "true",
          "--model.rollout_backend", "openai", "--model.openai", json.dumps({"base_url": server, "model": MODEL}),
          "--model.max_new_tokens", "48", "--eval.max_new_tokens", "48"])
    run = next(tmp_path.glob("tiny/version_*"))
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert {row["step"] for row in rows} == {0, 1}
    assert sum(bool(row["completion"].strip()) for row in rows) >= len(rows) // 2  # the served model answered
    with (run / "metrics.csv").open() as handle:
        assert any(row.get("reward/avg_batch_reward") for row in csv.DictReader(handle))
    out = capsys.readouterr().out
    assert out.count("(no update)") == 2
    assert f"Model: {MODEL} served at {server}" in out  # the banner names what samples, as ART's "Using vLLM at"


def test_spiral_against_a_served_opponent(server, tmp_path):
    """The tiny policy holds seat 1 and trains; seat 0 is SmolLM2 behind the server."""
    from rlcode.cli.command import main

    main(["fit", *SPIRAL_BASE, "--run.root_dir", str(tmp_path), "--model.mode.opponent", "served",
          "--model.mode.trained_seat", "1", "--model.mode.opponent_server", json.dumps({"base_url": server, "model": MODEL}),
          "--game_eval.at_start", "false", "--game_eval.at_end", "false"])
    games = [json.loads(line) for line in next(tmp_path.glob("tiny/version_*/rollouts.jsonl")).open()]
    assert games and all(g["learner_seats"] == [1] for g in games)
    served_turns = [turn for game in games for turn in game["turns"] if not turn["learner"]]
    assert served_turns and all(turn["player"] == 0 for turn in served_turns)
    assert sum(bool(turn["reply"].strip()) for turn in served_turns) >= len(served_turns) // 2


def test_rlcode_eval_generate_samples_and_scores_in_one_command(server, tmp_path, capsys):
    from rlcode.eval.cli import main

    samples = tmp_path / "served.jsonl"
    assert main(["--generate", str(samples), "--split", "validation", "--limit", "3", "--base-url", server,
                 "--model", MODEL, "--max-tokens", "160", "--timeout", "5"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["samples"] == 3 and summary["tasks"] == 3 and "pass@1" in summary
    results = [json.loads(line) for line in (tmp_path / "served_results.jsonl").read_text().splitlines()]
    assert len(results) == 3 and all("passed" in row and row["model"] == MODEL for row in results)
    assert any("def " in row["completion"] for row in results)  # SmolLM2 writes Python for MBPP prompts


def test_the_code_games_predictor_seat_played_by_the_real_server(server, pool):  # noqa: F811
    """The code game with its predictor served by llama.cpp (SmolLM2 here; the recipe's predictor is a
    GGUF too): K real answers per valid program, each parsed by the game's format and judged."""
    from rlcode.modes import CodeGame

    mode = CodeGame(opponent="served", opponent_server={"base_url": server, "model": MODEL, "api": "chat"},
                    opponent_tokenizer="smollm2-135m-instruct", opponent_max_new_tokens=16, opponent_temperature=0.0,
                    predictions_per_program=2, num_generations=2, program_timeout=5.0)
    learner = ScriptedLearner(pool, ["```python\nprint(6 * 7)\n```"] * 2, [], max_new_tokens=64)
    mode.configure(learner)
    experience = mode.collect(learner, {"text": ["numbers"]})
    predictions = [[turn for turn in episode.turns if turn.player == 1] for episode in experience.episodes]
    assert [len(turns) for turns in predictions] == [2, 2]
    for turn in (turn for turns in predictions for turn in turns):
        assert isinstance(turn.info["correct"], bool) and turn.info["expected"] == "42"
