"""One command for a lent GPU machine (one H100 or H200, no network, ~15 minutes): what rlcode's GPU path does.

Runs the checks of ``gpu_check_cases.py`` and ``gpu_check_decoding.py`` one after another, each in a
process of its own with its own time budget: a check that fails or outlasts its budget is reported as
such (its process group killed) and the rest still run, so one lease always comes back with every
answer it could get. A whole-run budget (``--total-budget``) caps the sum: a check gets what is left
when that is less than its own.
Its own process per check also gives each its own peak GPU memory and frees the GPU between checks.

First comes the platform line (the GPU, the precision and the platform profile ``rlcode fit`` picks
automatically), then one line per check. Results go to ``OUT/gpu_check_<date>.json`` (copy it into
``benchmarks/results/``) and the checks' own output to ``OUT/gpu_check.log``. Exit code 1 when any
check failed or ran out of time, 2 when there is no GPU and no ``--dry-run``.

    bash benchmarks/gpu_lease.sh                                # on the lent machine: installs the carried wheels, then this
    python benchmarks/gpu_check.py --out DIR                    # where the packages are already installed
    python benchmarks/gpu_check.py --dry-run --out DIR          # the same code on the CPU, a 2-layer model, seconds a check
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Seconds per check on the lent GPU, in the order they run (the most telling first, so a short lease
# still gets them). Sized from the first lease (H200, 2026-11-28, benchmarks/results/gpu_check_2026-11-28*.json):
# a check's whole process took platform 4 s, model 19-21, grpo_bf16 70 (~30 of it starting: imports, loading
# 6 GB of fp32 weights, Lightning), trl_bf16 50, shared_prefix 15, spiral 46, generation 44,
# quantized_linears 13, fsdp and vllm 4-13 (skipped at once); each budget is about 1.5x that. fp16_mixed and
# qlora_4bit outlasted 50 and 60 s there and were never timed: they get grpo_bf16's budget and more for the
# 4-bit load. Their sum (FSDP and vLLM aside, 700 s) is over the whole-run budget on purpose: a check that
# finishes early leaves its rest to later ones.
BUDGETS_S = {"platform": 30, "model": 45, "grpo_bf16": 110, "trl_bf16": 80, "fp16_mixed": 110, "qlora_4bit": 120,
             "shared_prefix": 30, "spiral": 75, "generation": 70, "quantized_linears": 30, "fsdp": 90, "vllm": 60}
TOTAL_BUDGET_S = 540  # the lease's call gets timeout_s 580: the wheels' install (2 s) and the report fit under it
DRY_RUN_BUDGET_S = 300  # on a shared 2-core CPU a dry-run check takes 10-40 s: the budget only catches a hang
P5_GOAL = {"tokens_per_s_ratio_at_least": 2.0, "peak_memory_ratio_at_most": 0.5}


def run_checks(args: argparse.Namespace) -> dict:
    """Every check in its own process, in order; the results dict written to ``args.out``."""
    needs_no_model = checks_registry()[1]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "gpu_check.log"
    budgets = _budgets(args)
    deadline = time.monotonic() + (args.total_budget or float("inf"))
    results: dict = {"date": datetime.date.today().isoformat(), "dry_run": args.dry_run, "checks": {}}
    with log_path.open("a") as log:
        for name in args.checks:
            left = deadline - time.monotonic()
            if name not in needs_no_model and results["checks"].get("model", {}).get("status") not in (None, "ok"):
                outcome = {"status": "skipped", "reason": "the model folder was not built"}
            elif left <= 0:
                outcome = {"status": "not_run", "reason": f"the whole run's budget ({args.total_budget} s) was spent"}
            else:
                outcome = run_one(name, min(budgets[name], left), args, log)
            results["checks"][name] = outcome
            if name == "platform" and outcome["status"] == "ok":
                results.update(platform=outcome["line"], versions=outcome["versions"])
                print(outcome["line"], flush=True)
            print(f"{name}: {json.dumps(outcome)}", flush=True)
    results["p5"] = p5_figure(results["checks"])
    print(f"p5: {json.dumps(results['p5'])}", flush=True)
    results_path = out / f"gpu_check_{results['date']}.json"
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"results: {results_path}; log: {log_path}", flush=True)
    return results


def run_one(name: str, budget_s: float, args: argparse.Namespace, log) -> dict:
    """``name`` in a child process of its own session, killed with its children past ``budget_s``."""
    with tempfile.TemporaryDirectory() as scratch:
        result_path = Path(scratch) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--result", str(result_path),
                   "--work-dir", args.work_dir, "--steps", str(args.steps), "--max-new-tokens", str(args.max_new_tokens)]
        command += ["--dry-run"] if args.dry_run else []
        log.write(f"\n===== {name} (budget {budget_s:.0f} s) =====\n")
        log.flush()
        started = time.monotonic()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = None
        seconds = round(time.monotonic() - started, 1)
        timing = {"seconds": seconds, "budget_s": round(budget_s, 1)}
        if code is None:
            return {"status": "over_budget", **timing}
        if not result_path.is_file():
            return {"status": "error", "error": f"exit code {code} before any result (see the log)", **timing}
        return {**json.loads(result_path.read_text()), **timing}


def run_child(args: argparse.Namespace) -> int:
    """One check in this process: its figures, ``status`` ok / skipped / error, as JSON at ``args.result``."""
    try:
        from gpu_check_cases import Setup

        outcome = checks_registry()[0][args.child](Setup(args))
        outcome = {"status": "skipped", "reason": outcome["skipped"]} if "skipped" in outcome else {"status": "ok", **outcome}
    except Exception as error:  # noqa: BLE001 - the parent reports it and goes on with the other checks
        traceback.print_exc()
        outcome = {"status": "error", "error": f"{type(error).__name__}: {error}"[:2000]}
    if os.environ.get("LOCAL_RANK", "0") == "0":  # the FSDP check's other ranks re-run this command
        Path(args.result).write_text(json.dumps(outcome))
    return 0 if outcome["status"] != "error" else 1


def checks_registry() -> tuple[dict, set]:
    """Every check by name, and those that need no model folder (imported late: ``main`` puts this
    folder on the path first)."""
    import gpu_check_cases as cases
    import gpu_check_decoding as decoding

    return {**cases.CHECKS, **decoding.CHECKS}, cases.NEEDS_NO_MODEL | decoding.NEEDS_NO_MODEL


def p5_figure(checks: dict) -> dict:
    """rlcode against TRL on the same bf16 GRPO steps: tokens/s and peak memory ratios, and the goal."""
    ours, theirs = checks.get("grpo_bf16", {}), checks.get("trl_bf16", {})
    if ours.get("status") != "ok" or theirs.get("status") != "ok":
        return {"status": "not measured", "reason": "grpo_bf16 and trl_bf16 must both be ok"}
    figure = {"goal": P5_GOAL}
    if ours.get("tokens_per_s") and theirs.get("tokens_per_s"):
        figure["tokens_per_s_ratio"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2)
    if ours.get("peak_gpu_gb") and theirs.get("peak_gpu_gb"):
        figure["peak_memory_ratio"] = round(ours["peak_gpu_gb"] / theirs["peak_gpu_gb"], 2)
    if {"tokens_per_s_ratio", "peak_memory_ratio"} <= set(figure):
        figure["goal_met"] = (figure["tokens_per_s_ratio"] >= P5_GOAL["tokens_per_s_ratio_at_least"]
                              and figure["peak_memory_ratio"] <= P5_GOAL["peak_memory_ratio_at_most"])
    return figure


def _budgets(args: argparse.Namespace) -> dict:
    budgets = {name: (DRY_RUN_BUDGET_S if args.dry_run else seconds) for name, seconds in BUDGETS_S.items()}
    for setting in args.budget:
        name, _, seconds = setting.partition("=")
        if name not in budgets or not seconds:
            raise SystemExit(f"--budget {setting}: expected CHECK=SECONDS with CHECK one of {', '.join(budgets)}")
        budgets[name] = float(seconds)
    return budgets


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the same code on the CPU with a 2-layer model")
    parser.add_argument("--checks", nargs="+", default=list(BUDGETS_S), choices=list(BUDGETS_S))
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-check-"),
                        help="where the JSON and the log go (default: $OUT, else a new temporary folder)")
    parser.add_argument("--budget", action="append", default=[], metavar="CHECK=SECONDS",
                        help="one check's time budget instead of its default (repeatable)")
    parser.add_argument("--total-budget", type=float, default=None,
                        help=f"seconds for all checks together (default {TOTAL_BUDGET_S} on a GPU, none in a dry run)")
    parser.add_argument("--steps", type=int, default=0, help="GRPO steps per check, the first is warm-up (0: 4; dry run: 1, untimed)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--work-dir", default=tempfile.gettempdir(), help="where the random model folder is saved")
    parser.add_argument("--child", choices=list(BUDGETS_S), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.total_budget is None and not args.dry_run:
        args.total_budget = TOTAL_BUDGET_S
    return args


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the checks' modules, gpu_vllm_smoke beside this file
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    if not args.dry_run and not _has_cuda():
        print("gpu_check.py needs a CUDA GPU (or --dry-run for the CPU); nothing was checked.", file=sys.stderr)
        return 2
    results = run_checks(args)
    return 0 if all(check["status"] in ("ok", "skipped") for check in results["checks"].values()) else 1


def _has_cuda() -> bool:
    """Asked in a child, so this process never holds a CUDA context the checks' memory would share."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "True"


if __name__ == "__main__":
    sys.exit(main())
