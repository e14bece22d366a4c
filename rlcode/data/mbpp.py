"""MBPP tasks: one loader for every form the data comes in, and the task-id split convention.

Formats accepted by :func:`load_mbpp` (``source``):

- the original ``mbpp.jsonl`` (one JSON object per line: text, code, task_id, test_setup_code,
  test_list, challenge_test_list);
- ``sanitized-mbpp.json`` (one JSON array: prompt, code, task_id, test_imports, test_list), whose
  ``prompt`` becomes ``text`` and whose ``test_imports`` become ``test_setup_code``;
- files written by ``datasets`` (``to_json`` JSON lines, ``to_parquet``, ``.arrow``) and
  ``save_to_disk`` directories (a Dataset or a DatasetDict);
- a directory holding ``mbpp.jsonl`` / ``sanitized-mbpp.json``;
- a hub id (``google-research-datasets/mbpp``, config ``full`` or ``sanitized``) through ``datasets``.

With ``source=None`` the path comes from ``MBPP_DATASET_PATH``. The local JSON path is stdlib
only, so ``rlcode-eval`` starts fast; ``datasets``/``pyarrow`` are imported only for their formats.

Splits follow the upstream README, by task id (the hub's splits use the same ranges), so a split
can be cut from any file whatever splits it was saved with.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rlcode.sandbox.asserts import bound_names, called_function_name

ENV_VAR = "MBPP_DATASET_PATH"
HUB_ID = "google-research-datasets/mbpp"
VARIANTS = ("full", "sanitized")
SPLIT_TASK_IDS: dict[str, range | tuple[int, ...]] = {
    "prompt": range(1, 11),
    "test": range(11, 511),
    "validation": range(511, 601),
    "train": range(601, 975),
    # Not upstream's: every problem that is neither trained on nor reported (prompt + validation),
    # for choosing a recipe without looking at the test split (benchmarks/learning_protocol.py).
    "selection": (*range(1, 11), *range(511, 601)),
}
SPLITS = (*SPLIT_TASK_IDS, "all")
_FILE_FOR_VARIANT = {"full": "mbpp.jsonl", "sanitized": "sanitized-mbpp.json"}


class MBPPDataError(ValueError):
    """The MBPP data could not be found or read; the message names the cause and the fix."""


@dataclass(frozen=True)
class MBPPTask:
    task_id: int
    text: str
    code: str
    test_list: tuple[str, ...]
    test_setup_code: str = ""
    challenge_test_list: tuple[str, ...] = ()
    variant: str = "full"
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property  # asked once per sample by rlcode-eval: parse the reference once
    def entry_point(self) -> str | None:
        """Name of the function the first test calls (what a completion must define)."""
        defined = bound_names(self.code)
        for test in self.test_list:
            name = called_function_name(test, defined)
            if name:
                return name
        return None


def load_mbpp(source: str | os.PathLike | None = None, split: str = "test",
              variant: str | None = None) -> list[MBPPTask]:
    """Load MBPP tasks of one split, sorted by task id.

    Args:
        source: a file, a directory or a hub id (see the module docstring); ``None`` reads
            ``MBPP_DATASET_PATH``.
        split: "prompt" (1-10), "test" (11-510), "validation" (511-600), "train" (601-974),
            "selection" (prompt + validation: 100 problems for choosing recipes) or "all".
        variant: "full" or "sanitized". For a directory or hub id it picks the file/config (default
            "full"); for a file the variant is read from its content, and asking for the other one
            uses the sibling file of that variant when it exists (so ``MBPP_DATASET_PATH`` pointing at
            ``mbpp.jsonl`` also serves ``variant="sanitized"``).
    """
    if split not in SPLITS:
        raise MBPPDataError(f"unknown MBPP split {split!r}: use one of {', '.join(SPLITS)}")
    if variant is not None and variant not in VARIANTS:
        raise MBPPDataError(f"unknown MBPP variant {variant!r}: use 'full' or 'sanitized'")
    tasks = _load_all(_resolve_source(source), variant)
    if split != "all":
        tasks = [t for t in tasks if t.task_id in SPLIT_TASK_IDS[split]]
    return sorted(tasks, key=lambda t: t.task_id)


def _resolve_source(source) -> str:
    if source is None:
        source = os.environ.get(ENV_VAR)
        if not source:
            raise MBPPDataError(
                f"no MBPP data given: set {ENV_VAR} to a local mbpp.jsonl (or a datasets folder), "
                f"or pass a path or the hub id {HUB_ID!r} when online")
    return os.fspath(source)


def _load_all(source: str, variant: str | None) -> list[MBPPTask]:
    path = Path(source).expanduser()
    if path.is_dir():
        return _load_directory(path, variant)
    if path.is_file():
        return _load_file(path, variant)
    if _looks_like_hub_id(source):
        return _load_hub(source, variant or "full")
    raise MBPPDataError(f"MBPP data not found at {source!r}: pass an existing file or folder "
                        f"(or set {ENV_VAR}), or the hub id {HUB_ID!r} when online")


def _looks_like_hub_id(source: str) -> bool:
    return source in ("mbpp", HUB_ID) or (source.count("/") == 1 and not source.startswith((".", "/", "~"))
                                          and not source.endswith((".json", ".jsonl", ".parquet", ".arrow")))


def _load_directory(path: Path, variant: str | None) -> list[MBPPTask]:
    wanted = variant or "full"
    plain = path / _FILE_FOR_VARIANT[wanted]
    if plain.is_file():
        return _load_file(plain, variant)
    if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
        return _records_to_tasks(_rows_from_datasets_disk(path), str(path))
    data_files = sorted(p for p in path.iterdir() if p.suffix in (".parquet", ".arrow", ".jsonl"))
    if data_files:
        tasks = [t for f in data_files for t in _load_file(f, variant)]
        return _check_variant(tasks, variant, f"{path}/")
    raise MBPPDataError(f"{path}: no {_FILE_FOR_VARIANT[wanted]}, save_to_disk data or "
                        f"parquet/arrow/jsonl files inside")


def _load_file(path: Path, variant: str | None) -> list[MBPPTask]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # lazily: only this format needs it

        tasks = _records_to_tasks(enumerate(pq.read_table(path).to_pylist(), start=1), str(path))
    elif suffix == ".arrow":
        tasks = _records_to_tasks(_rows_from_arrow(path), str(path))
    else:
        tasks = _records_to_tasks(_rows_from_json(path), str(path))
    if variant is not None and tasks and tasks[0].variant != variant:
        sibling = path.with_name(_FILE_FOR_VARIANT[variant])
        if sibling.is_file() and sibling != path:
            return _load_file(sibling, variant)
    return _check_variant(tasks, variant, str(path))


def _check_variant(tasks: list[MBPPTask], variant: str | None, where: str) -> list[MBPPTask]:
    if variant is not None and tasks and tasks[0].variant != variant:
        raise MBPPDataError(f"{where} holds the {tasks[0].variant} MBPP variant, not {variant!r}: "
                            f"pass the {_FILE_FOR_VARIANT[variant]} file instead")
    return tasks


def _rows_from_json(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) pairs from a JSON array file or a JSON-lines file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MBPPDataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise MBPPDataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise MBPPDataError(f"{path}: expected a JSON array of tasks or one task per line")
        return [(f"record {i}", row) for i, row in enumerate(data, start=1)]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            raise MBPPDataError(f"{path}:{number}: malformed JSON line ({e.msg})") from None
    return rows


def _rows_from_arrow(path: Path) -> list[tuple[int, dict]]:
    import pyarrow as pa  # lazily

    try:
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
    except pa.ArrowInvalid as e:
        raise MBPPDataError(f"{path}: not an Arrow file ({e})") from None
    return [(i + 1, row) for i, row in enumerate(table.to_pylist())]


def _rows_from_datasets_disk(path: Path) -> list[tuple[int, dict]]:
    import datasets  # lazily: heavy

    loaded = datasets.load_from_disk(str(path))
    parts = loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]
    return [(i + 1, row) for part in parts for i, row in enumerate(part)]


def _load_hub(hub_id: str, variant: str) -> list[MBPPTask]:
    try:
        import datasets  # lazily: heavy, and only needed for the hub

        loaded = datasets.load_dataset(hub_id, variant)
    except Exception as e:  # offline, missing package, unknown id: all end the same way for the user
        raise MBPPDataError(
            f"could not load {hub_id!r} ({variant}) from the hub ({type(e).__name__}: {str(e)[:120]}); "
            f"offline, set {ENV_VAR} to a local mbpp.jsonl or pass its path") from None
    rows = [(i + 1, row) for part in loaded.values() for i, row in enumerate(part)]
    return _records_to_tasks(rows, hub_id)


def _records_to_tasks(rows, where: str) -> list[MBPPTask]:
    tasks, seen = [], set()
    for number, row in rows:
        task = _record_to_task(row, _where(where, number))
        if task.task_id in seen:
            raise MBPPDataError(f"{_where(where, number)}: task_id {task.task_id} appears twice")
        seen.add(task.task_id)
        tasks.append(task)
    return tasks


def _where(where: str, number) -> str:
    return f"{where}: {number}" if isinstance(number, str) else f"{where}:{number}"


def _record_to_task(row: object, where: str) -> MBPPTask:
    if not isinstance(row, dict):
        raise MBPPDataError(f"{where}: expected a JSON object per task, got {type(row).__name__}")
    sanitized = "prompt" in row and "text" not in row
    text_key, setup_key = ("prompt", "test_imports") if sanitized else ("text", "test_setup_code")
    for key in ("task_id", text_key, "code", "test_list"):
        if key not in row:
            raise MBPPDataError(f"{where}: MBPP record lacks the {key!r} field")
    task_id, tests = row["task_id"], row["test_list"]
    if isinstance(task_id, str) and task_id.isdigit():  # some re-exports store ids as strings
        task_id = int(task_id)
    if type(task_id) is not int:
        raise MBPPDataError(f"{where}: task_id must be an integer, got {task_id!r:.40}")
    if not isinstance(tests, (list, tuple)) or not all(isinstance(t, str) for t in tests):
        raise MBPPDataError(f"{where}: test_list must be a list of strings")
    setup = row.get(setup_key) or ""
    if isinstance(setup, (list, tuple)):
        setup = "\n".join(setup)
    challenge = row.get("challenge_test_list") or ()
    extra = {k: v for k, v in row.items() if k not in (
        "task_id", text_key, "code", "test_list", setup_key, "challenge_test_list")}
    return MBPPTask(task_id=task_id, text=str(row[text_key]), code=str(row["code"]),
                    test_list=tuple(tests), test_setup_code=str(setup),
                    challenge_test_list=tuple(challenge),
                    variant="sanitized" if sanitized else "full", extra=extra)
