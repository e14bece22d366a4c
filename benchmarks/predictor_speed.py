"""The code game's predictor (Qwen2.5-Coder-0.5B-Instruct) in transformers against llama.cpp's server.

The same held-out cases as `code_game_vs_model.py skill` (MBPP test reference solutions + a call), the
game's predictor prompt, greedy, the recipe's 48-token answer budget:
  transformers  the pinned GGUF converted to fp32 (`qwen2.5-coder-0.5b-instruct`), the HF backend,
                all cases in batches of `--batch` (how the recipe's local predictor runs)
  llama.cpp     the pinned GGUF itself (Q4 weights) behind `llama_cpp.server` on 127.0.0.1 with the
                same threads, through rlcode's OpenAI backend (`api: chat`, the server's chat
                template), `--concurrency` requests in flight
Prints per side: wall seconds, answer tokens/s (the tokens each side generated), and right answers
(the game's comparison), so speed and skill are seen together: the two weights differ (fp32 from a Q4
file is the Q4 model dequantized, so both should answer alike; the count checks it).

    .venv/bin/python benchmarks/predictor_speed.py [--cases 40] [--threads 2] [--json out.json]

Needs `pip install 'rlcode[serve]'` (llama-cpp-python builds from source) for the llama.cpp side.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import code_game as game_bench  # noqa: E402  (the held-out cases)

from rlcode.envs.code_game import PREDICTOR_PROMPT, extract_prediction  # noqa: E402
from rlcode.models import load_model, load_tokenizer  # noqa: E402
from rlcode.models.qwen_coder import qwen_coder_gguf  # noqa: E402
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt  # noqa: E402
from rlcode.rollout.openai.backend import OpenAIBackend  # noqa: E402
from rlcode.rollout.rendering import ChatPrompt  # noqa: E402

PREDICTOR = "qwen2.5-coder-0.5b-instruct"
BUDGET = 48  # the recipe's opponent_max_new_tokens
STARTUP_SECONDS = 300


def messages(program: str) -> list[dict]:
    return [{"role": "user", "content": PREDICTOR_PROMPT.format(program=program.strip())}]


def transformers_side(cases: list[dict], batch: int) -> dict:
    tokenizer, model = load_tokenizer(PREDICTOR), load_model(PREDICTOR).eval()
    backend = HFGenerateBackend(model, tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=BUDGET, stop=game_bench.STOP)
    started, texts, tokens = time.perf_counter(), [], 0
    for start in range(0, len(cases), batch):
        prompts = [render_prompt(tokenizer, messages(c["program"]), chat=True) for c in cases[start:start + batch]]
        out = backend.generate(prompts, 1, params)
        texts += out.completion_texts
        tokens += out.num_generated_tokens
    return _report(cases, texts, tokens, time.perf_counter() - started)


def llama_cpp_side(cases: list[dict], threads: int, concurrency: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="predictor-speed-"))
    gguf = qwen_coder_gguf(folder / "gguf")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(folder / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "qwen",
                               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
                               "--n_threads", str(threads)], stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_for(server, base_url, folder / "server.log")
        backend = OpenAIBackend({"base_url": base_url, "model": "qwen", "api": "chat",
                                 "max_concurrency": concurrency, "logprobs": False, "timeout": 600.0})
        params = SamplingParams(temperature=0.0, max_new_tokens=BUDGET, stop=game_bench.STOP)
        started = time.perf_counter()
        out = backend.generate([ChatPrompt(messages(c["program"])) for c in cases], 1, params)
        return _report(cases, out.completion_texts, out.num_generated_tokens, time.perf_counter() - started)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _wait_for(server: subprocess.Popen, base_url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited with {server.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(base_url + "/models", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"llama_cpp.server did not answer within {STARTUP_SECONDS}s")


def _report(cases: list[dict], texts: list[str], tokens: int, seconds: float) -> dict:
    right = [extract_prediction(text) == case["expected"] for text, case in zip(texts, cases)]
    return {"cases": len(cases), "right": sum(right), "seconds": round(seconds, 1), "answer_tokens": int(tokens),
            "tokens_per_s": round(tokens / seconds, 1),
            "verdicts": {f"{c['task_id']}/{c['assert_index']}": r for c, r in zip(cases, right)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40, help="held-out cases (from the first MBPP test tasks)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="transformers: cases per batched generate")
    parser.add_argument("--concurrency", type=int, default=1, help="llama.cpp: requests in flight")
    parser.add_argument("--sides", nargs="+", default=["transformers", "llama.cpp"], choices=["transformers", "llama.cpp"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = game_bench.heldout_cases(load_tokenizer(PREDICTOR), args.cases, 1, budget=BUDGET)[:args.cases]
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
              "load_avg_1m_start": os.getloadavg()[0]}
    for side in args.sides:
        report[side] = (transformers_side(cases, args.batch) if side == "transformers"
                        else llama_cpp_side(cases, args.threads, args.concurrency))
        print(f"{side:12s} {report[side]['seconds']:7.1f} s  {report[side]['tokens_per_s']:6.1f} answer tokens/s  "
              f"right {report[side]['right']}/{report[side]['cases']}", flush=True)
    report["load_avg_1m_end"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
