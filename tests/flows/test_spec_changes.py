"""A run's spec changes only with intent: what a resume may change, what it refuses, and
the history `spec.yaml` keeps (README, "Resuming a run")."""

import warnings

import pytest
import yaml

from flows.spec import RenamedField, parse_spec
from flows.spec_changes import changes_from, described, differences, fixed, history, yaml_value
from flows.train import prepare_run_dir  # a Prefect task: `.fn` is its function
from tasks.runtime.session.failures import Unrecoverable


def spec_of(tmp_path, *overrides):
    return parse_spec("name: x\nlearner:\n  steps: 8\nsync:\n  interval: 4\n",
                      [f"checkpoint.dir={tmp_path / 'run'}", *overrides])


def test_differences_are_the_leaves_that_differ_in_order(tmp_path):
    old, new = spec_of(tmp_path), spec_of(tmp_path, "learner.steps=16", "model.d_model=128")
    changes = differences(yaml.safe_load(old.to_yaml()), yaml.safe_load(new.to_yaml()))
    assert changes == [("model.d_model", 64, 128), ("learner.steps", 8, 16)]
    assert fixed(changes) == [("model.d_model", 64, 128)]
    assert described(changes) == "  model.d_model: 64 -> 128\n  learner.steps: 8 -> 16"


def test_a_whole_fixed_section_and_a_field_beside_one_are_told_apart():
    assert fixed([("data.source", "env", "/p.jsonl"), ("env.kwargs.values", 12, 16), ("env.latency_s", 0, 0.5),
                  ("learner.optimizer.lr", 1e-3, 2e-3), ("learner.optimizer.max_grad_norm", 1.0, None),
                  ("learner.optimizer.warmup_steps", 0, 50), ("learner.optimizer.min_lr_ratio", 0.1, 0.0)]) == [
        ("data.source", "env", "/p.jsonl"), ("env.kwargs.values", 12, 16), ("learner.optimizer.max_grad_norm", 1.0, None),
        ("learner.optimizer.warmup_steps", 0, 50)]


def test_the_run_spec_keeps_a_history_of_accepted_changes(tmp_path):
    logged = []
    run_dir = prepare_run_dir.fn(spec_of(tmp_path), log=logged.append)
    first = (run_dir / "spec.yaml").read_text()
    prepare_run_dir.fn(spec_of(tmp_path), log=logged.append)  # the same spec: nothing to record
    assert (run_dir / "spec.yaml").read_text() == first and not logged
    prepare_run_dir.fn(spec_of(tmp_path, "learner.steps=16"), log=logged.append)
    prepare_run_dir.fn(spec_of(tmp_path, "learner.steps=16", "learner.optimizer.lr=0.002"), log=logged.append)
    text = (run_dir / "spec.yaml").read_text()
    changes = history(text)
    assert len(changes) == 2 and changes[0].endswith("learner.steps 8 -> 16")
    assert changes[1].endswith("learner.optimizer.lr 0.0003 -> 0.002")
    assert yaml.safe_load(text)["learner"]["steps"] == 16 and len(logged) == 2


def test_a_change_the_checkpoints_depend_on_fails_before_the_run_spec_changes(tmp_path):
    run_dir = prepare_run_dir.fn(spec_of(tmp_path), log=print)
    before = (run_dir / "spec.yaml").read_text()
    with pytest.raises(Unrecoverable, match="changes seed, model.n_layers"):
        prepare_run_dir.fn(spec_of(tmp_path, "model.n_layers=3", "seed=1"), log=print)
    assert (run_dir / "spec.yaml").read_text() == before


def test_a_field_added_since_the_run_began_is_no_change(tmp_path):
    """A run's spec.yaml written before a field existed reads it as its default."""
    spec = spec_of(tmp_path)
    older = "\n".join(line for line in spec.to_yaml().splitlines() if "qkv_bias" not in line)
    assert changes_from(older, spec.to_yaml()) == []
    assert differences({"model": {"d_model": 64}}, {"model": {"d_model": 64, "qkv_bias": False}}) == [
        ("model.qkv_bias", None, False)]  # read raw, the same file differs


def test_a_field_renamed_since_the_run_began_is_no_change(tmp_path):
    """A run's spec.yaml written under a field's old name (flows.spec.RENAMED) reads it as the new."""
    spec = spec_of(tmp_path)
    older = spec.to_yaml().replace("  groups_per_worker: 16\n", "  actors: 16\n")
    assert older != spec.to_yaml()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedField)  # compared, not loaded: its loading warns, not this
        assert changes_from(older, spec.to_yaml()) == []


def test_a_value_is_shown_as_set_takes_it():
    assert [yaml_value(v) for v in ([1, 2], {"a": 1}, None, 0.5, "a b", True)] == [
        "[1, 2]", "{a: 1}", "null", "0.5", "a b", "true"]
