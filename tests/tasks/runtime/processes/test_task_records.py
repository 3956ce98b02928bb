"""The learner task's records: the run's versions table and lineage under keys of its own."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tasks.config import EvalConfig
from tasks.run_dir import RunDir
from tasks.runtime.processes import task_records
from tasks.runtime.state.checkpoints import Checkpoints

SPEC = SimpleNamespace(name="Guess Number", learner=SimpleNamespace(steps=8), run_dir=Path("/nonexistent/run"),
                       eval=EvalConfig())


def test_each_run_records_its_versions_under_a_key_of_its_own(monkeypatch):
    """A key shared by every run showed, on its page, whichever run sent its table last."""
    sent = []
    monkeypatch.setattr(task_records, "_flow_run_name", lambda: "amber-otter")
    monkeypatch.setattr(task_records, "record_version", lambda **fields: sent.append(("version", fields["key"])))
    monkeypatch.setattr(task_records, "record_versions_table", lambda **fields: sent.append(("table", fields["key"])))
    records = task_records.TaskRecords(SPEC, "tcp://127.0.0.1:1", None)
    records.version({"version": 1, "row": {"version": 1, "step": 4}})
    records._send_table()
    assert sent == [("version", "guess-number-amber-otter"), ("table", "guess-number-amber-otter")]


def test_outside_a_flow_run_the_key_is_the_runs_name():
    assert task_records.TaskRecords(SPEC, "tcp://127.0.0.1:1", None).artifact_key == "guess-number"


def test_a_resumed_runs_table_is_read_from_its_checkpoints_and_each_version_adds_its_row(monkeypatch, tmp_path):
    checkpoints = Checkpoints(RunDir(tmp_path).checkpoints, keep=None)
    for version in (1, 2):
        rows = [{"version": v, "step": 4 * v} for v in range(1, version + 1)]
        checkpoints.save(version, {"w": np.zeros(2, np.float32)}, {"versions": rows})
    checkpoints.close()
    sent = []
    monkeypatch.setattr(task_records, "record_version", lambda **fields: sent.append(fields["rows"]))
    records = task_records.TaskRecords(SimpleNamespace(**{**vars(SPEC), "run_dir": tmp_path}), "tcp://127.0.0.1:1", None)
    records.version({"version": 3, "row": {"version": 3, "step": 12}})
    assert [(row["version"], row["step"]) for row in sent[0]] == [(1, 4), (2, 8), (3, 12)]
