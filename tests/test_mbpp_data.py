"""MBPP loading: every accepted format gives the same tasks; splits by task id; clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcode.data import MBPPDataError, MBPPTask, load_mbpp
from mbpp_location import mbpp_file  # noqa: E402

SHARED = mbpp_file().parent
needs_shared = pytest.mark.skipif(not (SHARED / "mbpp.jsonl").is_file(), reason="MBPP data not found")

# Synthetic records (never real MBPP text): one per split, one with setup and challenge tests.
FULL_ROWS = [
    {"task_id": 3, "text": "Return one.", "code": "def one():\r\n    return 1",
     "test_list": ["assert one() == 1"], "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 42, "text": "Add two numbers.", "code": "def add(a, b):\n    return a + b",
     "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
     "test_setup_code": "import math", "challenge_test_list": ["assert add(-1, 1) == 0"]},
    {"task_id": 550, "text": "Negate.", "code": "def neg(x):\n    return -x",
     "test_list": ["assert neg(2) == -2"], "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 700, "text": "Identity.", "code": "def ident(x):\n    return x",
     "test_list": ["assert ident(5) == 5"], "test_setup_code": "", "challenge_test_list": []},
]
SANITIZED_ROWS = [
    {"source_file": "x", "task_id": 42, "prompt": "Write add.", "code": "def add(a, b): return a + b",
     "test_imports": ["import math", "import re"], "test_list": ["assert add(1, 2) == 3"]},
    {"source_file": "x", "task_id": 601, "prompt": "Write ident.", "code": "def ident(x): return x",
     "test_imports": [], "test_list": ["assert ident(1) == 1"]},
]


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ids(tasks: list[MBPPTask]) -> list[int]:
    return [t.task_id for t in tasks]


def test_original_jsonl_fields_and_splits(tmp_path):
    path = _write_jsonl(tmp_path / "mbpp.jsonl", FULL_ROWS)
    assert _ids(load_mbpp(path, "all")) == [3, 42, 550, 700]
    assert _ids(load_mbpp(path, "prompt")) == [3]
    assert _ids(load_mbpp(path, "test")) == [42]
    assert _ids(load_mbpp(path, "validation")) == [550]
    assert _ids(load_mbpp(path, "train")) == [700]
    task = load_mbpp(path, "test")[0]
    assert task.test_setup_code == "import math"
    assert task.challenge_test_list == ("assert add(-1, 1) == 0",)
    assert task.variant == "full" and task.entry_point == "add"


def test_sanitized_json_maps_prompt_and_imports(tmp_path):
    path = tmp_path / "sanitized-mbpp.json"
    path.write_text(json.dumps(SANITIZED_ROWS, indent=4))
    task = load_mbpp(path, "test")[0]
    assert (task.task_id, task.text, task.variant) == (42, "Write add.", "sanitized")
    assert task.test_setup_code == "import math\nimport re"
    assert task.extra == {"source_file": "x"}


def test_variant_picks_sibling_file_and_directory(tmp_path):
    _write_jsonl(tmp_path / "mbpp.jsonl", FULL_ROWS)
    (tmp_path / "sanitized-mbpp.json").write_text(json.dumps(SANITIZED_ROWS))
    assert load_mbpp(tmp_path / "mbpp.jsonl", "all", variant="sanitized")[0].variant == "sanitized"
    assert _ids(load_mbpp(tmp_path, "all", variant="sanitized")) == [42, 601]
    assert _ids(load_mbpp(tmp_path, "all")) == [3, 42, 550, 700]


def test_variant_mismatch_without_sibling_is_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "data.jsonl", FULL_ROWS)
    with pytest.raises(MBPPDataError, match="full MBPP variant"):
        load_mbpp(path, "all", variant="sanitized")


def test_parquet_and_datasets_formats(tmp_path):
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_list(FULL_ROWS)
    dataset.to_parquet(str(tmp_path / "mbpp.parquet"))
    dataset.to_json(str(tmp_path / "exported.json"))  # datasets writes JSON lines
    dataset.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"test": dataset.select([1]), "train": dataset.select([0, 2, 3])}) \
        .save_to_disk(str(tmp_path / "saved_dict"))
    arrow_file = next((tmp_path / "saved").glob("*.arrow"))
    expected = load_mbpp(_write_jsonl(tmp_path / "mbpp.jsonl", FULL_ROWS), "all")
    for source in ("mbpp.parquet", "exported.json", "saved", "saved_dict", arrow_file):
        assert load_mbpp(tmp_path / source, "all") == expected, source


def test_sanitized_parquet(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(SANITIZED_ROWS).to_parquet(str(tmp_path / "s.parquet"))
    tasks = load_mbpp(tmp_path / "s.parquet", "all")
    assert [t.variant for t in tasks] == ["sanitized", "sanitized"]
    assert tasks[0].test_setup_code == "import math\nimport re"


def test_env_var_is_the_default_source(tmp_path, monkeypatch):
    monkeypatch.setenv("MBPP_DATASET_PATH", str(_write_jsonl(tmp_path / "m.jsonl", FULL_ROWS)))
    assert _ids(load_mbpp(split="train")) == [700]


def test_no_source_offline_names_the_env_var(monkeypatch):
    monkeypatch.delenv("MBPP_DATASET_PATH", raising=False)
    with pytest.raises(MBPPDataError, match="MBPP_DATASET_PATH"):
        load_mbpp()


def test_hub_id_offline_names_the_env_var(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(MBPPDataError, match="MBPP_DATASET_PATH"):
        load_mbpp("google-research-datasets/mbpp")


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(MBPPDataError, match="not found"):
        load_mbpp(tmp_path / "nope.jsonl")


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(FULL_ROWS[0]) + "\n" + "{not json\n")
    with pytest.raises(MBPPDataError, match=r"bad\.jsonl:2: malformed JSON"):
        load_mbpp(path, "all")


def test_missing_field_names_the_field(tmp_path):
    row = dict(FULL_ROWS[1])
    del row["test_list"]
    path = _write_jsonl(tmp_path / "m.jsonl", [FULL_ROWS[0], row])
    with pytest.raises(MBPPDataError, match=r"m\.jsonl:2: .*'test_list'"):
        load_mbpp(path, "all")


def test_duplicate_task_id_is_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "m.jsonl", [FULL_ROWS[0], FULL_ROWS[0]])
    with pytest.raises(MBPPDataError, match="appears twice"):
        load_mbpp(path, "all")


def test_unknown_split_and_variant(tmp_path):
    path = _write_jsonl(tmp_path / "m.jsonl", FULL_ROWS)
    with pytest.raises(MBPPDataError, match="unknown MBPP split"):
        load_mbpp(path, "dev")
    with pytest.raises(MBPPDataError, match="unknown MBPP variant"):
        load_mbpp(path, "all", variant="tiny")


@needs_shared
@pytest.mark.parametrize("variant, counts", [
    ("full", {"test": 500, "validation": 90, "train": 374, "prompt": 10, "all": 974}),
    ("sanitized", {"test": 257, "validation": 43, "train": 120, "prompt": 7, "all": 427}),
])
def test_real_split_counts(variant, counts):
    for split, count in counts.items():
        assert len(load_mbpp(SHARED, split, variant=variant)) == count, split


@needs_shared
def test_real_data_fields():
    tasks = load_mbpp(SHARED / "mbpp.jsonl", "all")
    assert sum(bool(t.test_setup_code) for t in tasks) == 2
    assert sum(bool(t.challenge_test_list) for t in tasks) == 11
    assert all(len(t.test_list) == 3 and t.entry_point for t in tasks)
    sanitized = load_mbpp(SHARED / "sanitized-mbpp.json", "all")
    assert sum(bool(t.test_setup_code) for t in sanitized) == 13
