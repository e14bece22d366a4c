"""The confirmation table of a registered recipe, from its ``confirmation_*.json`` records.

    .venv/bin/python benchmarks/confirmation_report.py benchmarks/results/confirmation_RECIPE_DATE.json [MORE...]

Prints one markdown row per seed of every record given (a confirmation may run as several invocations,
each its own record), whatever the seed showed, with its training minutes (the steps alone; from its
run directory's metrics.csv where the record predates them) beside the whole fit's (evals included),
then each record's dates, load and registration hash, and per seed a sentence on the test's power
(``mcnemar_power``). Seeds a record names but never scored
(a failed or stopped fit) get a row saying so: a confirmation is reported whole.

The power's gain share defaults to the exploratory wide recipe's (2026-11-26, 90 steps, seeds 0-2: 56
of its 74 discordant test problems were gains): what the registered recipe was expected to do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_mbpp import training_minutes  # noqa: E402
from mcnemar_power import power_sentence  # noqa: E402

EXPLORATORY_GAIN_SHARE = 56 / 74
ALPHA = 0.05


def seed_rows(record: dict) -> list[str]:
    """The markdown rows of one record: a scored seed's numbers, or why it has none."""
    scored = {row["seed"]: row for row in record["rows"]}
    lines = []
    for seed in record["seeds"]:
        minutes = record.get("minutes", {}).get(str(seed), "-")
        row = scored.get(seed)
        if row is None:
            why = record.get("failed", {}).get(str(seed)) or record.get("status", "not run")
            lines.append(f"| {seed} | - | - / {minutes} | not scored: {why} | | | | |")
            continue
        held_out = row.get("humaneval")
        humaneval = (f"{held_out['passed_before']} -> {held_out['passed_after']} (p {held_out['mcnemar_p']:.2g})"
                     if held_out else "not scored")
        run = Path(row["run"]) if row.get("run") else None
        training = row.get("training_minutes") or (training_minutes(run) if run and run.is_dir() else None)
        lines.append(f"| {seed} | {row['steps']} | {training or '-'} / {minutes} "
                     f"| {row['passed_before']} -> {row['passed_after']} "
                     f"| {len(row['lost'])} / {len(row['gained'])} | {row['mcnemar_p']:.2g} "
                     f"| {'yes' if row['mcnemar_p'] < ALPHA else 'no'} | {humaneval} |")
    return lines


def _load(record: dict, end: str) -> str:
    value = record.get(f"load_avg_1m_{end}")
    return "-" if value is None else f"{value:.2f}"


def report(records: list[dict], gain_share: float = EXPLORATORY_GAIN_SHARE) -> str:
    lines = ["| seed | steps | minutes: training / whole fit | MBPP test passed (of 500) | lost / gained | McNemar p "
             f"| p < {ALPHA} | HumanEval (of 164) |", "|---|---|---|---|---|---|---|---|"]
    for record in records:
        lines += seed_rows(record)
    significant = sum(row["mcnemar_p"] < ALPHA for record in records for row in record["rows"])
    seeds = sum(len(record["seeds"]) for record in records)
    lines += ["", f"Significant in {significant} of {seeds} seeds."]
    for record in records:
        lines.append(f"- seeds {record['seeds']}: {record.get('started_at')} -> {record.get('finished_at')}, "
                     f"{record.get('status')}, load average {_load(record, 'start')} at the start and "
                     f"{_load(record, 'end')} at the end; {record['registration']} "
                     f"(config sha256 {record['config_sha256']})")
    for record in records:
        for row in record["rows"]:
            lines.append(f"- seed {row['seed']}: {power_sentence(row, gain_share, ALPHA)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, nargs="+", help="confirmation_*.json files")
    parser.add_argument("--gain-share", type=float, default=EXPLORATORY_GAIN_SHARE,
                        help="the share of discordant problems assumed to be gains, for the power")
    args = parser.parse_args()
    records = [json.loads(path.read_text()) for path in args.records]
    if any(record.get("kind") != "confirmation" for record in records):
        sys.exit("confirmation_report: pass confirmation_*.json records (written by learning_protocol.py confirm)")
    print(report(records, args.gain_share))


if __name__ == "__main__":
    main()
