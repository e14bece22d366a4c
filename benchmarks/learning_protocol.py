"""Learning evidence that survives a second look: choose a recipe without the test split, register
it, then confirm it on fresh seeds on the test split, every confirmation reported.

Three commands, in this order:

    .venv/bin/python benchmarks/learning_protocol.py select --config RECIPE [OVERLAY...] --seeds 0 1 2
    .venv/bin/python benchmarks/learning_protocol.py register --config RECIPE [OVERLAY...] --seeds 10 11 12
    .venv/bin/python benchmarks/learning_protocol.py confirm --config RECIPE [OVERLAY...] --seeds 10 11 12

(``-- ARGS`` after any of them: more ``rlcode fit`` arguments, part of the recipe and of its hash.)

**select** trains the recipe per seed (``rlcode fit``) and scores the base model and each trained
model on the *selection* split only: MBPP's prompt (tasks 1-10) and validation (511-600) problems,
100 problems that are neither trained on (training draws from train, 601-974) nor reported (test,
11-510). Why these and not a held-out slice of train: train is what the recipes learn from, and
cutting it would change every recipe's data and need the DataModule to exclude the slice; the
prompt and validation splits cost nothing and are already outside both. 100 problems scored greedily
once give too few discordant problems for power, so each problem's pass@1 is estimated from
``--samples`` completions at ``--temperature`` (default 8 at 0.8), and before/after are compared by
a paired sign-flip permutation test on the per-problem differences of those estimates (two-sided,
``PERMUTATIONS`` random sign flips from a fixed seed, so a result file recomputes). Greedy McNemar
on the same problems is reported beside it. Results: ``benchmarks/results/selection_<recipe>_<date>.json``,
which records its seeds: the seeds a recipe was chosen with can never confirm it.

**register** writes ``benchmarks/results/registration_<recipe>_<date>.json`` before any
confirmation: the recipe's resolved config (``rlcode fit --config ... [fit arguments after --]
--print_config``) and its sha256, and the seeds it will run. It refuses seeds that an earlier
results file used. What the protocol adds at run time is fixed here, not by the recipe, and so not
hashed: each seed (``--data.seed``, ``--model.generation_seed``), the run directory and threads, and
the eval's split and sampling (``SELECTION_EVAL``, ``CONFIRMATION_EVAL``); the recipe's own eval
settings (token limit, timeout, prompt format) are hashed.

**confirm** refuses to run unless a registration names this recipe with the same config hash and
these seeds, and refuses any seed that an earlier results file in ``benchmarks/results/`` used (a
``"seed"`` or ``"seeds"`` entry anywhere in it; registrations reserve seeds, they do not use them).
It then runs ``learning_mbpp.py``'s measurement (greedy pass@1 on the 500 test problems, McNemar,
HumanEval before/after) and writes ``benchmarks/results/confirmation_<recipe>_<date>.json`` before
the first fit (status "running") and again after every seed, so a confirmation that shows nothing,
fails or is stopped is on record, and its seeds are used.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_mbpp as measure  # noqa: E402  (the sibling script: fits, HumanEval, McNemar)

RESULTS = REPO / "benchmarks" / "results"
PERMUTATIONS = 20_000
SELECTION_EVAL = ["--data.eval_split", "selection", "--eval.num_questions", "null", "--eval.every_n_steps", "0"]
CONFIRMATION_EVAL = ["--data.eval_split", "test", "--eval.num_questions", "null", "--eval.every_n_steps", "0",
                     "--eval.num_samples", "0"]

Printer = Callable[[list[Path], list[str]], str]


class Refused(Exception):
    """The protocol says no: one line naming the cause and the fix."""


# ---- the recipe's identity -------------------------------------------------------------------
def print_config(configs: list[Path], extra: list[str]) -> str:
    """The recipe's resolved config, as ``rlcode fit`` would run it (YAML text)."""
    overlays = [argument for config in configs for argument in ("--config", str(config))]
    command = [sys.executable, "-m", "rlcode.cli", "fit", *overlays, *extra, "--print_config"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise Refused(f"rlcode fit --print_config failed ({done.stderr.strip().splitlines()[-1:]}): fix the recipe")
    return done.stdout


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def recipe_key(configs: list[Path], extra: list[str]) -> dict:
    """How a registration names its recipe: config paths relative to the repository, extra arguments."""
    def relative(path: Path) -> str:
        path = path.resolve()
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    return {"configs": [relative(config) for config in configs], "fit_args": list(extra)}


def recipe_name(configs: list[Path]) -> str:
    return "+".join(config.stem for config in configs)


# ---- seeds -----------------------------------------------------------------------------------
def used_seeds(results: Path, skip: Path | None = None) -> dict[int, str]:
    """Seed -> the first results file that used it: every ``"seed"`` (an int) or ``"seeds"`` (ints)
    anywhere in every JSON file of ``results``, registrations (which only reserve) and ``skip`` left out."""
    used: dict[int, str] = {}
    for path in sorted(results.glob("*.json")):
        if path == skip:
            continue
        report = json.loads(path.read_text())
        if isinstance(report, dict) and report.get("kind") == "registration":
            continue
        for seed in sorted(_seeds_in(report)):
            used.setdefault(seed, path.name)
    return used


def _seeds_in(value) -> set[int]:
    found: set[int] = set()
    pending = [value]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "seed" and isinstance(item, int):
                    found.add(item)
                elif key == "seeds" and isinstance(item, list):
                    found.update(seed for seed in item if isinstance(seed, int))
                else:
                    pending.append(item)
        elif isinstance(value, list):
            pending.extend(value)
    return found


def refuse_used(seeds: list[int], results: Path, skip: Path | None = None) -> None:
    used = used_seeds(results, skip)
    for seed in seeds:
        if seed in used:
            raise Refused(f"seed {seed} was used by {used[seed]}: choose seeds no results file in {results} names")


# ---- register / check --------------------------------------------------------------------------
def register(configs: list[Path], extra: list[str], seeds: list[int], results: Path = RESULTS,
             printer: Printer | None = None) -> Path:
    if not seeds or len(set(seeds)) != len(seeds):
        raise Refused(f"register needs distinct seeds, got {seeds}: pass --seeds with fresh, distinct numbers")
    refuse_used(seeds, results)
    text = (printer or print_config)(configs, extra)
    record = {"kind": "registration", **recipe_key(configs, extra), "reserved": sorted(seeds),
              "config_sha256": config_hash(text), "registered_at": _now(), "resolved_config": text}
    path = _new_file(results, f"registration_{recipe_name(configs)}")
    path.write_text(json.dumps(record, indent=1))
    return path


def registration_for(configs: list[Path], extra: list[str], seeds: list[int], results: Path = RESULTS,
                     printer: Printer | None = None) -> Path:
    """The registration a confirmation of these seeds runs under; refused when there is none, when
    the recipe's config changed since (its hash), or when a seed was not registered or is used."""
    key = recipe_key(configs, extra)
    found = [(path, record) for path, record in _registrations(results)
             if all(record.get(name) == value for name, value in key.items())]
    if not found:
        raise Refused(f"recipe {' '.join(key['configs'] + extra)} is not registered: run "
                      "learning_protocol.py register with it and the seeds first")
    now = config_hash((printer or print_config)(configs, extra))
    matching = [(path, record) for path, record in found if record["config_sha256"] == now]
    if not matching:
        path, record = found[-1]
        raise Refused(f"the recipe's config changed since {path.name} (sha256 {record['config_sha256'][:12]} "
                      f"registered, {now[:12]} now): register the changed recipe anew with fresh seeds")
    path, record = next(((p, r) for p, r in matching if set(seeds) <= set(r["reserved"])), matching[-1])
    missing = sorted(set(seeds) - set(record["reserved"]))
    if missing:
        raise Refused(f"seeds {missing} are not in {path.name} (registered: {record['reserved']}): "
                      "confirm registered seeds only, or register these")
    refuse_used(seeds, results)
    return path


def _registrations(results: Path) -> list[tuple[Path, dict]]:
    return [(path, json.loads(path.read_text())) for path in sorted(results.glob("registration_*.json"))]


# ---- selection ---------------------------------------------------------------------------------
def sampled_rates(path: Path) -> dict:
    """Task -> its pass@1 estimated from the eval's samples (samples passed / samples)."""
    report = json.loads(path.read_text())
    rates = {p["task_id"]: p["samples_passed"] / p["samples"] for p in report["problems"] if p.get("samples")}
    if not rates:
        raise Refused(f"{path} has no sampled completions: run selection with --samples > 0")
    return rates


def paired_permutation_p(before: dict, after: dict, permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided p of the mean per-problem change under random sign flips (the null: training changed
    nothing, so each problem's before and after are exchangeable). Counts the observed statistic, so
    p >= 1 / (permutations + 1)."""
    if before.keys() != after.keys():
        raise Refused(f"the evals scored different problems ({len(before)} vs {len(after)}): "
                      "compare runs of the same selection split")
    changes = [after[task] - before[task] for task in sorted(before)]
    observed = abs(sum(changes))
    rng = random.Random(seed)
    extreme = sum(abs(sum(c if rng.random() < 0.5 else -c for c in changes)) >= observed - 1e-12
                  for _ in range(permutations))
    return (extreme + 1) / (permutations + 1)


def selection_row(seed: int, run: Path, baseline: Path | None) -> dict:
    files = measure.eval_files(run)
    start = files.get(0) or baseline
    if start is None or not files:
        raise Refused(f"{run} has no start or end eval: run the first seed with its start eval")
    before, after = measure.scored_alike(start, files[max(files)])
    rates_before, rates_after = sampled_rates(before), sampled_rates(after)
    greedy = measure.compare(measure.verdicts(before), measure.verdicts(after))
    return {"seed": seed, "run": str(run), "steps": max(files), "problems": len(rates_before),
            "sampled_pass_at_1_before": sum(rates_before.values()) / len(rates_before),
            "sampled_pass_at_1_after": sum(rates_after.values()) / len(rates_after),
            "permutation_p": paired_permutation_p(rates_before, rates_after),
            "greedy": {k: greedy[k] for k in ("passed_before", "passed_after", "lost", "gained", "mcnemar_p")}}


# ---- running ---------------------------------------------------------------------------------
def select(args, extra: list[str]) -> Path:
    if "--data.eval_split" in extra:
        raise Refused("selection scores the selection split only: drop --data.eval_split from the fit arguments")
    sampling = ["--eval.num_samples", str(args.samples), "--eval.temperature", str(args.temperature),
                "--eval.k", "[1]"]
    path = _new_file(args.results, f"selection_{recipe_name(args.config)}")
    record = {"kind": "selection", **recipe_key(args.config, extra), "split": "selection (MBPP tasks 1-10, 511-600)",
              "samples": args.samples, "temperature": args.temperature, "permutations": PERMUTATIONS,
              "seeds": args.seeds, "started_at": _now(), "rows": []}
    rows = record["rows"]

    def scored(seed: int, run: Path, baseline: Path | None) -> None:
        rows.append(selection_row(seed, run, baseline))

    _run_seeds(args, [*extra, *SELECTION_EVAL, *sampling], record, path, scored, humaneval=False)
    return path


def confirm(args, extra: list[str]) -> Path:
    registration = registration_for(args.config, extra, args.seeds, args.results)
    record = {"kind": "confirmation", **recipe_key(args.config, extra), "registration": registration.name,
              "config_sha256": json.loads(registration.read_text())["config_sha256"], "seeds": args.seeds,
              "split": "test (MBPP tasks 11-510), greedy", "started_at": _now(), "rows": []}
    path = _new_file(args.results, f"confirmation_{recipe_name(args.config)}")
    humaneval_base: list[Path] = []

    def prepare() -> None:  # the base model's HumanEval verdicts, once (greedy: the same for every seed)
        if args.humaneval:
            humaneval_base.append(measure.humaneval_test(args.config, args.root / "humaneval-base", args.threads, None))

    def scored(seed: int, run: Path, baseline: Path | None) -> None:
        record["rows"].extend(measure.summarize([(seed, run)], baseline, next(iter(humaneval_base), None)))

    _run_seeds(args, [*extra, *CONFIRMATION_EVAL], record, path, scored, humaneval=args.humaneval, prepare=prepare)
    return path


def _run_seeds(args, fit_args: list[str], record: dict, path: Path, scored, humaneval: bool,
               prepare: Callable[[], None] = lambda: None) -> None:
    """Each seed's fit and scoring, the record rewritten before the first and after every seed, and
    marked finished, failed or stopped at the end, whatever the numbers show."""
    record.update(status="running", load_avg_1m_start=os.getloadavg()[0], minutes={}, failed={})
    baseline = getattr(args, "baseline", None)  # a start eval scored before (same settings): no start eval
    if baseline is not None:
        record["baseline"] = str(baseline)
    _write(path, record)
    try:
        prepare()
        for seed in args.seeds:
            run = args.root / f"{recipe_name(args.config)}-seed{seed}"
            minutes, code = measure.fit(args.config, seed, run, args.threads, baseline is None, fit_args)
            record["minutes"][str(seed)] = round(minutes, 1)
            if code:
                record["failed"][str(seed)] = f"rlcode fit exited {code}"
            elif humaneval:
                measure.humaneval_test(args.config, run / "humaneval", args.threads, measure.last_checkpoint(run))
            files = measure.eval_files(run)
            if max(files, default=0) > 0:  # else it never scored a trained model
                scored(seed, run, baseline)
            baseline = baseline or files.get(0)  # greedy, and samples seeded by the step: every seed's start
            _write(path, record)
        record["status"] = "failed" if record["failed"] else "finished"
    except BaseException as error:  # stopped or broken: still on record, then raised
        record["status"] = f"stopped: {type(error).__name__}: {error}"[:200]
        raise
    finally:
        record.update(finished_at=_now(), load_avg_1m_end=os.getloadavg()[0])
        _write(path, record)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _new_file(results: Path, stem: str) -> Path:
    """``<stem>_<date>.json`` in ``results``, numbered when one exists: no record is overwritten."""
    results.mkdir(parents=True, exist_ok=True)
    date = datetime.date.today().isoformat()
    path, number = results / f"{stem}_{date}.json", 1
    while path.exists():
        number += 1
        path = results / f"{stem}_{date}_{number}.json"
    return path


def _write(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("select", "register", "confirm"))
    parser.add_argument("--config", type=Path, nargs="+", required=True, help="the recipe: a config and overlays")
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--root", type=Path, help="run directories (default: a new temp dir)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where records are read and written")
    parser.add_argument("--samples", type=int, default=8, help="select: completions per problem for pass@1")
    parser.add_argument("--temperature", type=float, default=0.8, help="select: their temperature")
    parser.add_argument("--baseline", type=Path, help="the base model's verdicts on the split scored (select: "
                        "rlcode validate; confirm: an earlier seed's eval/step_0.json), same eval settings: every "
                        "seed reuses them and none evaluates at start, so seeds can run as parallel invocations")
    parser.add_argument("--no-humaneval", dest="humaneval", action="store_false", help="confirm: skip HumanEval")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: more rlcode fit arguments (hashed)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1:]
    args.root = args.root or Path(tempfile.mkdtemp(prefix=f"learning-{args.command}-"))
    if args.command == "register":
        path = register(args.config, extra, args.seeds, args.results)
    elif args.command == "select":
        path = select(args, extra)
    else:
        path = confirm(args, extra)
    print(f"learning_protocol: {args.command}: {path}")


if __name__ == "__main__":
    try:
        main()
    except (Refused, FileNotFoundError, ValueError) as error:
        sys.exit(f"learning_protocol: {error}")
