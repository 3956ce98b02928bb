"""Evaluations beside training, with a real Prefect server: a failed eval is retried, and
one that fails every retry is logged, never raised (training goes on). The cluster's
part (`play_on_cluster`) is scripted here; the end-to-end tests play on a real one."""

import json
from pathlib import Path

import numpy as np
import pytest
from prefect import flow

from learner.config import ModelConfig
from tasks.config import ActorsConfig, EnvConfig, EvalConfig
from tasks.eval import task as eval_task
from tasks.eval.play import EvalSetup
from tasks.eval.runner import Evaluations

OUTCOME = {"scores": {"prompts": 1, "episodes": 1, "success_rate": 1.0, "reward_mean": 1.0}, "episodes": []}


class Log:
    def __init__(self):
        self.warnings = []

    def warning(self, message):
        self.warnings.append(message)


def evaluations(tmp_path: Path, log: Log, retries: int) -> Evaluations:
    setup = EvalSetup(EvalConfig(every=1, retries=retries), EnvConfig(), ActorsConfig(), ModelConfig(), ("p",))
    (tmp_path / "spec.yaml").write_text("name: t\n")
    return Evaluations(setup, "tcp://127.0.0.1:1", run_name="t", run_dir=tmp_path, log=log)


def scripted(monkeypatch, failures: int) -> list:
    calls = []

    def play_on_cluster(setup, cluster, params_bytes, version):
        calls.append(version)
        if len(calls) <= failures:
            raise ConnectionError("worker lost")
        return OUTCOME

    monkeypatch.setattr(eval_task, "play_on_cluster", play_on_cluster)
    return calls


@pytest.mark.parametrize("failures, retries, recorded", [(1, 2, [3]), (3, 2, [])])
def test_a_failed_eval_is_retried_then_logged(prefect_api, tmp_path, monkeypatch, failures, retries, recorded):
    calls, log = scripted(monkeypatch, failures), Log()

    @flow
    def training():  # where the learner task submits them
        evals = evaluations(tmp_path, log, retries)
        evals.submit(version=3, step=12, params={"w": np.zeros(2, np.float32)}, checkpoint=None)
        try:
            return evals.finished(wait_s=60)
        finally:
            evals.close()

    lines = training()
    assert [line["version"] for line in lines] == recorded
    assert len(calls) == min(failures + 1, retries + 1)
    if recorded:
        assert json.loads((tmp_path / "eval/v3.json").read_text())["success_rate"] == 1.0
        assert log.warnings == []
    else:
        assert log.warnings == ["the eval of version 3 failed, training goes on: ConnectionError: worker lost"]
