"""An evaluation's results in the run directory: scores, the eval series, the best version,
the weights kept for export, the versions table."""

import json

from tasks.eval.results import best_version, read_scores, record_eval, weights_path
from tasks.records.metrics_log import MetricsLog
from tasks.records.versions import VersionTable


def outcome(success):
    return {"scores": {"prompts": 2, "episodes": 2, "success_rate": success, "reward_mean": success,
                       "pass_at_1": success}, "episodes": [{"prompt": "p", "turns": []}] * 2}


def test_results_are_recorded_and_the_best_weights_kept(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "version": 1, "time": 0.0, "reward_mean": 0}) + "\n")
    for version, success in [(2, 0.5), (4, 1.0), (6, 0.5)]:
        record_eval(tmp_path, version=version, step=version, checkpoint=None, outcome=outcome(success),
                    params_bytes=b"weights %d" % version)
    record_eval(tmp_path, version=8, step=8, checkpoint=tmp_path / "checkpoints/8", outcome=outcome(0.0),
                params_bytes=b"w8")
    assert [s["version"] for s in read_scores(tmp_path)] == [2, 4, 6, 8]
    assert best_version(read_scores(tmp_path))["version"] == 4
    # The best and the latest without a checkpoint; a checkpointed version needs none.
    assert sorted(p.name for p in weights_path(tmp_path, 0).parent.iterdir()) == ["v4.safetensors"]
    assert len((tmp_path / "episodes/eval/v6.jsonl").read_text().splitlines()) == 2
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in metrics.read()] == [1]
    assert [(r["version"], r["eval"]["success_rate"]) for r in metrics.read_evals()] == \
        [(2, 0.5), (4, 1.0), (6, 0.5), (8, 0.0)]


def test_ties_go_to_the_later_version():
    assert best_version([{"version": 1, "success_rate": 1.0, "reward_mean": 1.0},
                         {"version": 3, "success_rate": 1.0, "reward_mean": 1.0}])["version"] == 3
    assert best_version([]) is None


def test_the_versions_table_holds_checkpoints_and_evals_in_either_order():
    table = VersionTable(scores=[{"version": 4, "step": 4, "success_rate": 0.5, "reward_mean": 0.5, "pass_at_1": 0.5}])
    table.add_eval({"version": 2, "step": 2, "checkpoint": None, "success_rate": 0.25, "reward_mean": 0.1})
    table.add_rows([{"version": 4, "step": 4, "checkpoint": "c/4", "parent": None, "reward_mean": 0.2}])
    assert table.rows() == [
        {"version": 2, "step": 2, "checkpoint": None, "eval_success_rate": 0.25, "eval_reward_mean": 0.1},
        {"version": 4, "step": 4, "checkpoint": "c/4", "eval_success_rate": 0.5, "eval_reward_mean": 0.5,
         "eval_pass_at_1": 0.5, "parent": None, "reward_mean": 0.2}]
