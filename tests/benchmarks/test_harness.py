"""The benchmarks' shared arithmetic on made-up metrics records (no runs: they take minutes)."""

import json
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks are scripts that import their siblings

from harness import _records, emit, reached, steady_rates  # noqa: E402


def records(successes, step_s=0.5, train_s=0.4):
    return [{"step": i + 1, "time": 100.0 + step_s * (i + 1), "train_s": train_s, "reward_mean": s,
             "success_rate": s, "prompt_ids": [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3]}
            for i, s in enumerate(successes)]


def test_target_is_reached_when_the_mean_of_five_steps_reaches_it():
    rs = records([0.2, 1.0, 1.0, 1.0, 1.0, 1.0, 0.9])
    assert reached(rs, 0.9)["step"] == 6  # steps 2..6 average 1.0; steps 1..5 only 0.84
    assert reached(rs, 0.99)["step"] == 6
    assert reached(records([0.5] * 10), 0.9) is None


def test_steady_rates_skip_the_first_steps_and_count_a_batch_once():
    rs = records([0.0] * 10)
    rates = steady_rates(rs, skip=3)
    assert rates["busy"] == pytest.approx(0.8)
    assert rates["groups_per_s"] == pytest.approx(8.0)
    for r in rs[1::2]:  # two steps (epochs) per batch of 4 groups
        r["prompt_ids"] = rs[rs.index(r) - 1]["prompt_ids"]
    assert steady_rates(rs, skip=2)["groups_per_s"] == pytest.approx(4.0)
    assert steady_rates(records([0.0] * 3))["busy"] is None


def test_a_half_written_last_line_is_not_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "excluded": {"filtered": 1}')
    assert _records(path) == [{"step": 1}]


def test_emit_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    emit("title", [{"a": 1, "b": 0.12345}, {"a": 2, "b": None}], out, note="x")
    printed = capsys.readouterr().out
    assert "title" in printed and "0.123" in printed
    written = json.loads(out.read_text())
    assert written["rows"][1] == {"a": 2, "b": None} and written["note"] == "x"
    assert "load_avg" in written["machine"]


def test_actor_pool_runs_pinned_dask_processes_and_stops_them():
    import os

    import psutil
    from distributed import Client

    from harness import actor_pool

    cores = {sorted(os.sched_getaffinity(0))[0]}
    with actor_pool(cores, workers=2) as address, Client(address) as client:
        workers = client.scheduler_info()["workers"]
        assert sorted(w["nthreads"] for w in workers.values()) == [2, 2]  # an actor task and other work each
        assert client.run(lambda: sorted(os.sched_getaffinity(0))) == {w: sorted(cores) for w in workers}
        pids = [p.pid for p in psutil.Process().children() if "dask" in " ".join(p.cmdline())]
        assert len(pids) == 3  # the scheduler and two workers
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids)


def test_an_eval_worker_is_pinned_apart_and_carries_the_eval_resource():
    import os

    from distributed import Client

    from harness import actor_pool

    cores = sorted(os.sched_getaffinity(0))
    actor_cores, eval_cores = {cores[0]}, {cores[-1]}
    with actor_pool(actor_cores, eval_cores=eval_cores) as address, Client(address) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        placed = client.run(lambda: sorted(os.sched_getaffinity(0)))
        assert {tuple(w["resources"].items()): placed[a] for a, w in workers.items()} == {
            (("actor", 1),): sorted(actor_cores), (("eval", 1),): sorted(eval_cores)}
