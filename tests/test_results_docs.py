"""The results page is what ``benchmarks/report.py`` writes now, and every figure a doc ties to a results file
is that file's value.

The convention: a figure is a markdown link to its results file whose title is the JSON pointer
(RFC 6901) of the value, ``[3.08x](../benchmarks/results/X.json "/results/0/tokens_per_s_ratio")``. The
first number in the link text is compared with the value rounded to the digits shown (a ``%`` in the
text compares the value x 100); text without a number must equal the value (a string, or true/false).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r'\[([^\]]+)\]\(([^)\s]*benchmarks/results/[^)\s]+\.json|results/[^)\s]+\.json|[^)\s/]+\.json)'
                    r'\s+"(/[^"]*)"\)')
NUMBER = re.compile(r"-?\d[\d,]*(?:\.(\d+))?(?:[eE]([-+]?\d+))?")
RESULTS_NAME = re.compile(r"(?<![\w/])(?:benchmarks/)?results/([\w.+*<>-]+\.json)")


def _docs() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    return [REPO / name for name in listed if (REPO / name).is_file()]


def _report():
    spec = importlib.util.spec_from_file_location("benchmarks_report", REPO / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolve(pointer: str, data):
    for raw in pointer.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        data = data[int(key)] if isinstance(data, list) else data[key]
    return data


def _matches(text: str, value) -> bool:
    number = NUMBER.search(text)
    if number is None or isinstance(value, (str, bool)) or value is None:
        return text.strip("`") == json.dumps(value).strip('"')
    shown = float(number.group(0).replace(",", ""))
    if "%" in text:
        value = value * 100
    decimals = len(number.group(1) or "")
    exponent = int(number.group(2) or 0)
    half_unit = 0.5 * 10.0 ** (exponent - decimals)
    return math.isclose(shown, value, abs_tol=half_unit * (1 + 1e-9))


def _figures():
    for doc in _docs():
        for lineno, line in enumerate(doc.read_text().splitlines(), 1):
            for match in FIGURE.finditer(line):
                yield f"{doc.relative_to(REPO)}:{lineno}", doc, match.groups()


FIGURES = list(_figures())


def test_the_results_page_is_what_the_report_writes_now():
    report = _report()
    assert report.PAGE.read_text() == report.render(), "docs/results.md is stale: run benchmarks/report.py"


def test_every_results_file_has_figures_on_the_page():
    page = (REPO / "docs" / "results.md").read_text()
    for path in sorted((REPO / "benchmarks" / "results").glob("*.json")):
        assert f'{path.name} "/' in page, path.name


def test_the_docs_tie_figures_to_results_files():
    docs = {where.split(":")[0] for where, _, _ in FIGURES}
    assert {"docs/results.md", "docs/algorithm.md", "docs/served-models.md"} <= docs


@pytest.mark.parametrize(("where", "doc", "figure"), FIGURES, ids=[where for where, _, _ in FIGURES])
def test_a_figure_is_its_results_files_value(where, doc, figure):
    text, target, pointer = figure
    path = (doc.parent / target).resolve()
    assert path.is_file(), f"{where}: {target} is not a results file"
    value = _resolve(pointer, json.loads(path.read_text()))
    assert _matches(text, value), f"{where}: shows {text!r}, {target} {pointer} holds {value!r}"


def test_every_results_file_a_doc_names_exists():
    results = REPO / "benchmarks" / "results"
    for doc in _docs():
        for lineno, line in enumerate(doc.read_text().splitlines(), 1):
            for name in RESULTS_NAME.findall(line):
                if "<" in name:  # a pattern the text explains, e.g. gpu_check_<date>.json
                    continue
                assert list(results.glob(name.replace("...", "*"))), f"{doc.relative_to(REPO)}:{lineno}: no results file {name}"


def test_the_number_check_rounds_to_the_digits_shown():
    assert _matches("3.08x", 3.0815) and not _matches("3.09x", 3.0815)
    assert _matches("4,033 MB", 4032.9) and _matches("5.0e-05", 4.99975e-05)
    assert _matches("53.6%", 0.5357) and _matches("ok", "ok") and _matches("true", True)
    assert not _matches("26", 27)


def test_the_benchmarks_index_names_every_script():
    index = (REPO / "benchmarks" / "README.md").read_text()
    missing = [path.name for path in sorted((REPO / "benchmarks").glob("*.py")) if path.name not in index]
    assert not missing, f"benchmarks/README.md has no entry for {missing}"
