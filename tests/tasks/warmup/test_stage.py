"""The warm-up stage on a tiny model: it learns the expert's actions, and a warm-up
stopped (or killed) between checkpoints resumes reading exactly the demonstrations it
had not trained on, none twice."""

import json

import jax
import numpy as np
import pytest

from flows.spec import Spec
from learner.config import FieldError
from learner.sharding import make_mesh
from tasks.run_dir import RunDir
from tasks.warmup.stage import order, warm_up, warmed_params


def spec(tmp_path, steps=12):
    return Spec.model_validate({
        "name": "warm", "env": {"entrypoint": "calculator", "max_turns": 3},
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 64, "max_len": 16,
                  "tokenizer": {"alphabet": "0123456789+-*=?"}},
        "learner": {"steps": 4, "batch_groups": 1, "buckets": [16]},
        "actors": {"group_size": 2},
        "warmup": {"examples": 64, "steps": steps, "batch": 16, "rows": 16, "checkpoint_every": 4,
                   "optimizer": {"lr": 0.01}},
        "checkpoint": {"dir": str(tmp_path / "run")}})


def records(run_dir):
    return [json.loads(line) for line in RunDir(run_dir).warmup_metrics.read_text().splitlines()]


def test_each_epoch_visits_every_demonstration_once_in_an_order_of_its_own():
    first, second = order(0, 10, 10, seed=1), order(10, 10, 10, seed=1)
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    assert order(3, 10, 12, seed=1) == (first + second)[3:15]


def test_the_warm_up_learns_and_its_last_checkpoint_is_version_0(tmp_path):
    s, logs = spec(tmp_path), []
    result = warm_up(s, logs.append)
    assert result["stopped"] == "steps" and result["step"] == 12 and result["demonstrations"] == 64
    rows = records(s.run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert rows[-1]["nll"] < rows[0]["nll"] / 2, [r["nll"] for r in rows]
    assert sorted(int(p.name) for p in RunDir(s.run_dir).warmup_checkpoints.iterdir()) == [8, 12]
    params = warmed_params(s, make_mesh(s.learner.mesh))
    assert jax.tree.structure(params) is not None and all(np.isfinite(np.asarray(x)).all()
                                                         for x in jax.tree.leaves(params))
    assert warm_up(s, logs.append)["step"] == 12 and len(records(s.run_dir)) == 12  # finished: nothing more


def test_a_stopped_warm_up_resumes_at_its_cursor_and_reads_nothing_twice(tmp_path):
    s = spec(tmp_path)
    calls = iter(range(100))
    stopped = warm_up(s, print, interrupted=lambda: next(calls) >= 6)  # after 6 updates: between checkpoints
    assert stopped["stopped"] == "interrupted" and stopped["step"] == 6
    # A kill after update 6 would leave records past the checkpoint: a resume drops them.
    with RunDir(s.run_dir).warmup_metrics.open("a") as f:
        f.write(json.dumps({"step": 7, "cursor": [96, 112], "nll": 0.0}) + "\n")
    assert warm_up(s, print)["step"] == 12
    rows = records(s.run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["cursor"] for r in rows] == [[16 * k, 16 * (k + 1)] for k in range(12)]
    read = [i for r in rows for i in order(r["cursor"][0], 64, 16, seed=s.seed)]
    assert sorted(read) == sorted(list(range(64)) * 3)  # three epochs, each demonstration once in each


def test_demonstrations_that_do_not_fit_the_rows_are_named(tmp_path):
    s = spec(tmp_path)
    s = s.model_copy(update={"warmup": s.warmup.model_copy(update={"rows": 8})})
    with pytest.raises(FieldError, match=r"warmup.rows: 16 samples \(144 tokens, longest 9\) do not fit in 8 rows"):
        warm_up(s, print)
