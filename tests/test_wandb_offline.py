"""W&B for real, offline: a short ``rlcode fit --run.wandb offline`` writes a W&B run folder holding the
config, the history under rlcode's metric names and the rollout table; resuming the run
(``--ckpt_path last``) logs into the same run id. The ``.wandb`` file is read record by record
(W&B's LevelDB-style log of protobuf records), so the test sees what ``wandb sync`` would upload.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED_METRICS = {"reward/avg_batch_reward", "reward/successful_predictions_count", "mbpp_eval/pass_rate",
                "mbpp_eval/problems_passed"}


def wandb_records(path: Path):
    """Protobuf records of a ``run-<id>.wandb`` file (32 KiB blocks of crc/length/type-framed chunks)."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B", "not a W&B transaction log"
    while position + 7 <= len(data):
        room = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position:position + 7]) if room >= 7 else (0, 0, 0)
        if room < 7 or (length == 0 and kind == 0):  # block padding
            position += room
            continue
        if position + 7 + length > len(data):  # still being written
            return
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first start a record
        if kind in (1, 4):  # full/last end it
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def finished(path: Path, timeout: float = 60.0) -> Path:
    """``path`` once W&B's service has written the run's exit record: ``wandb.finish()`` returns
    before its (separate) writer process has flushed everything."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
            return path
        time.sleep(0.5)
    raise AssertionError(f"{path} has no exit record after {timeout}s")


def history(path: Path) -> list[dict]:
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def config_keys(path: Path) -> set[str]:
    return {item.key or "/".join(item.nested_key) for record in wandb_records(path)
            if record.WhichOneof("record_type") == "config" for item in record.config.update}


def fit(root: Path, *extra: str) -> None:
    from rlcode.cli.command import main

    main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml"),
          "--run.root_dir", str(root), "--run.wandb", "offline", "--eval.at_start", "false",
          "--eval.num_questions", "1", *extra])


def test_offline_wandb_run_holds_config_history_and_rollouts_and_resume_keeps_its_id(tmp_path, monkeypatch):
    """W&B was only ever disabled in tests; a resumed run opened a new W&B run."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    fit(tmp_path)
    run = tmp_path / "tiny/version_0"
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    first = sorted((run / "wandb").glob("offline-run-*"))
    assert len(first) == 1 and first[0].name.endswith(run_id), "the W&B run id is the run's id"
    log = finished(first[0] / f"run-{run_id}.wandb")

    # the learner's settings, and the mode (class path and its settings, num_generations among them)
    keys = config_keys(log)
    assert {"config", "learning_rate"} <= keys and [k for k in keys if k.startswith("mode")], sorted(keys)
    rows = history(log)
    steps = {row["trainer/global_step"] for row in rows if "reward/avg_batch_reward" in row}
    assert steps == {0, 1}
    assert SEED_METRICS <= set().union(*rows), SEED_METRICS - set().union(*rows)
    tables = list((first[0] / "files/media/table").glob("rollouts_*.table.json"))
    assert tables, "the rollout table"
    table = json.loads(tables[0].read_text())
    assert table["columns"][:4] == ["step", "task_id", "prompt", "completion"] and table["data"]

    fit(tmp_path, "--ckpt_path", "last", "--trainer.max_steps", "3")
    assert not (tmp_path / "tiny/version_1").exists()
    runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(path.name.endswith(run_id) for path in runs), "resume continues the same run id"
    resumed = finished(next(path for path in runs if path != first[0]) / f"run-{run_id}.wandb")
    steps = {row["trainer/global_step"] for row in history(resumed) if "reward/avg_batch_reward" in row}
    assert steps == {2}, "the resumed run logs the steps after the checkpoint"


def test_training_executions_are_tagged_with_run_step_and_task():
    """The sandbox knew run tags but GRPO never passed its run id, so
    ``pool.list({"run": ...})`` / ``pool.stop`` by run found nothing."""
    import time
    from types import SimpleNamespace

    from lightning.pytorch.strategies import SingleDeviceStrategy

    from rlcode.modes import GRPO

    from grpo_harness import learner
    from rlcode.training.run_context import SandboxSettings

    module = learner(GRPO, model_name="tiny-random", rewards=["execution"], sandbox=SandboxSettings(workers=1), reward_timeout=20.0)
    module.run_id = "run0123abcd"
    module._trainer = SimpleNamespace(strategy=SingleDeviceStrategy(), num_devices=1)
    module.mode.setup(module, "fit")
    rewards, sandbox = module.mode.reward_mixture, module.mode._sandbox
    try:
        job = rewards.start(["p"], ["```python\nimport time\ntime.sleep(30)\n```"], task_id=[601], step=7)
        deadline = time.monotonic() + 20
        while not sandbox.list({"run": "run0123abcd"}) and time.monotonic() < deadline:
            time.sleep(0.05)
        listed = sandbox.list({"run": "run0123abcd"})
        assert [info.tags for info in listed] == [{"run": "run0123abcd", "step": "7", "task": "601"}]
        assert sandbox.stop({"run": "run0123abcd"}) == 1
        assert job.result().total == [-1.0]  # a stopped program scores as a failure
    finally:
        module.teardown("fit")
