"""One command for a lent GPU machine (one H100 or H200, no network, ~15 minutes): what rlcode's GPU path does.

Runs the checks of ``gpu_check_pairs.py`` (rlcode against TRL, one side a check), ``gpu_check_cases.py``
and ``gpu_check_decoding.py`` one after another, each in a
process of its own with its own time budget: a check that fails or outlasts its budget is reported as
such (its process group killed) and the rest still run, so one lease always comes back with every
answer it could get. A whole-run budget (``--total-budget``) caps the sum: a check gets what is left
when that is less than its own.
Its own process per check also gives each its own peak GPU memory and frees the GPU between checks.

First comes the platform line (the GPU, the precision and the platform profile ``rlcode fit`` picks
automatically), then one line per check, then ``p5``: rlcode / TRL for every pair whose two sides ran
in the call (``p5_figure``). Results go to ``OUT/gpu_check_<date>.json`` (copy it into
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

# Seconds per check on the lent GPU, in the order they run: the rlcode / TRL pairs first, the most telling
# first (64x512 full, LoRA, checkpointing, then 16x128), then the older single-side checks, so a lease
# that runs out of time still has the pairs. A budget is ~1.4x an estimate from the first lease (H200,
# 2026-11-28, benchmarks/results/gpu_check_2026-11-28*.json), where a process spent ~30 s starting (imports,
# 6 GB of fp32 weights, Lightning), rlcode's 16x128 steps took 19 s (the first: ~12 s of one-off CUDA and
# allocator warm-up) then ~6.6 s (decoding 4.5-4.8 s: 128 launch-bound decode steps of ~36 ms, whatever
# the rows), TRL's 13.7 then ~5.4 s (generate() ~24 ms a token). At 64x512 decoding is 4x the steps at
# about the same cost each (launch-bound: 64 rows add little), ~18 s rlcode / ~12 s TRL, and training
# ~14x the tokens, a few seconds: rlcode 30 + a 34 s warm-up + a 22 s step = ~86 s, TRL ~75. LoRA adds
# peft's per-linear calls to every decode step (taken as 1.6x the decoding) and takes the optimizer and
# weight gradients away: ~108 / ~87. Checkpointing recomputes the forward (~1.3x the training): ~88 /
# ~77. 16x128 with two timed steps: ~62 / ~55. packed_pass (the first lease's shared_prefix, 15 s) adds
# two passes of 8 micro-batches of 8 x ~712 tokens, never run on a GPU: 45, the most room for error.
# generation (44 s there) adds the floor's copies, decode steps at 16 and 64 rows and a profile: ~55.
# The older checks keep their budgets (fp16_mixed and qlora_4bit outlasted 50 and 60 s there and were
# never timed). The pairs come to ~660 s with platform and model, over the whole-run budget: one call
# gets platform, model and the 64x512 full and LoRA pairs (~380 s), the checkpointing pair only if
# those finish early; the rest need a second call (``--checks``). A check that finishes early leaves
# its rest to later ones.
BUDGETS_S = {"platform": 30, "model": 45,
             "rlcode_64x512": 120, "trl_64x512": 105, "rlcode_64x512_lora": 150, "trl_64x512_lora": 125,
             "rlcode_64x512_ckpt": 125, "trl_64x512_ckpt": 110, "rlcode_16x128": 90, "trl_16x128": 80,
             "packed_pass": 45, "generation": 80, "fp16_mixed": 110, "qlora_4bit": 120, "spiral": 75,
             "quantized_linears": 30, "fsdp": 90, "vllm": 60}
TOTAL_BUDGET_S = 540  # the lease's call gets timeout_s 580: the wheels' install (2 s) and the report fit under it
DRY_RUN_BUDGET_S = 300  # on a shared 2-core CPU a dry-run check takes 10-40 s: the budget only catches a hang
# The GPU goal for rlcode against TRL at a code RL step's size: twice the completion tokens/s at most
# 0.75x the peak memory for a full fine-tune, 0.5x under LoRA.
P5_GOAL = {"64x512": {"tokens_per_s_ratio_at_least": 2.0, "peak_memory_ratio_at_most": 0.75},
           "64x512_lora": {"tokens_per_s_ratio_at_least": 2.0, "peak_memory_ratio_at_most": 0.5}}


def run_checks(args: argparse.Namespace) -> dict:
    """Every check in its own process, in order; the results dict written to ``args.out``."""
    from run_record import run_record

    needs_no_model = checks_registry()[1]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "gpu_check.log"
    budgets = _budgets(args)
    deadline = time.monotonic() + (args.total_budget or float("inf"))
    results: dict = {"date": datetime.date.today().isoformat(), "dry_run": args.dry_run,
                     **run_record(), "checks": {}}
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
    results["p5"] = p5_figure(results["checks"], dry_run=args.dry_run)
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
    import gpu_check_pairs as pairs

    modules = (cases, pairs, decoding)
    return ({name: check for module in modules for name, check in module.CHECKS.items()},
            set().union(*(module.NEEDS_NO_MODEL for module in modules)))


def p5_figure(checks: dict, dry_run: bool = False) -> dict:
    """rlcode / TRL for every pair whose two sides ran in this call: ``{pair: {"tokens_per_s_ratio",
    "peak_memory_ratio"}}`` (a ratio None where a side lacks the figure: no GPU), ``not_measured`` (pairs
    asked for with a side not ok), the goal and ``goal_met`` (None until every goal pair is measured,
    unless one already misses it; always None in a dry run, whose CPU figures say nothing of a GPU's)."""
    from gpu_check_pairs import PAIRS

    figure, not_measured = {}, {}
    for pair in PAIRS:
        ours, theirs = checks.get(f"rlcode_{pair}"), checks.get(f"trl_{pair}")
        if ours is None and theirs is None:
            continue
        ours, theirs = ours or {"status": "not asked"}, theirs or {"status": "not asked"}
        if ours["status"] == theirs["status"] == "ok":
            figure[pair] = {"tokens_per_s_ratio": _ratio(ours.get("tokens_per_s"), theirs.get("tokens_per_s")),
                            "peak_memory_ratio": _ratio(ours.get("peak_gpu_gb"), theirs.get("peak_gpu_gb"))}
        else:
            not_measured[pair] = f"rlcode_{pair} {ours['status']}, trl_{pair} {theirs['status']}"
    if not_measured:
        figure["not_measured"] = not_measured
    verdicts = []
    for pair, goal in P5_GOAL.items():
        ratios = figure.get(pair, {})
        speed, memory = ratios.get("tokens_per_s_ratio"), ratios.get("peak_memory_ratio")
        if speed is not None and speed < goal["tokens_per_s_ratio_at_least"] \
                or memory is not None and memory > goal["peak_memory_ratio_at_most"]:
            verdicts.append(False)
        else:
            verdicts.append(None if speed is None or memory is None else True)
    figure["goal"] = P5_GOAL
    figure["goal_met"] = None if dry_run else False if False in verdicts else (True if all(verdicts) else None)
    return figure


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 2) if ours and theirs else None


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
    parser.add_argument("--steps", type=int, default=0,
                        help="GRPO steps per check, the first is warm-up (0: the pair's size's, 4 for the other "
                             "checks; dry run: 1, untimed)")
    parser.add_argument("--max-new-tokens", type=int, default=128,
                        help="new tokens of the checks other than the pairs (whose sizes fix theirs)")
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
