"""The learner task's records: the run's versions table and lineage under keys of its own."""

from pathlib import Path
from types import SimpleNamespace

from tasks.config import EvalConfig
from tasks.runtime import task_records

SPEC = SimpleNamespace(name="Guess Number", learner=SimpleNamespace(steps=8), run_dir=Path("/nonexistent/run"),
                       eval=EvalConfig())


def test_each_run_records_its_versions_under_a_key_of_its_own(monkeypatch):
    """A key shared by every run showed, on its page, whichever run sent its table last."""
    sent = []
    monkeypatch.setattr(task_records, "_flow_run_name", lambda: "amber-otter")
    monkeypatch.setattr(task_records, "record_version", lambda **fields: sent.append(("version", fields["key"])))
    monkeypatch.setattr(task_records, "record_versions_table", lambda **fields: sent.append(("table", fields["key"])))
    records = task_records.TaskRecords(SPEC, "tcp://127.0.0.1:1", None)
    records.version({"version": 1, "new_rows": [{"version": 1, "step": 4}]})
    records._send_table()
    assert sent == [("version", "guess-number-amber-otter"), ("table", "guess-number-amber-otter")]


def test_outside_a_flow_run_the_key_is_the_runs_name():
    assert task_records.TaskRecords(SPEC, "tcp://127.0.0.1:1", None).artifact_key == "guess-number"
