"""Actors beyond one process tree: a Dask scheduler and workers started on their own (as on
several machines), and a cluster class named in the spec."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client

from tasks.buffer.ledger import balanced
from tasks.actors.cluster import ACTOR_ENV
from tests.conftest import ROOT, free_port, tandem

pytestmark = pytest.mark.e2e

TINY = ["--set", "learner.batch_groups=4", "--set", "buffer.capacity=8", "--set", "learner.steps=8"]
BIN = Path(sys.executable).parent


@pytest.mark.slow  # 58 s on 2 cores: CI's time (README, "The two commands")
def test_actors_on_separately_started_scheduler_and_workers(prefect_api, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, **ACTOR_ENV, "PYTHONPATH": str(ROOT)}
    scheduler = subprocess.Popen([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port",
                                  address.rsplit(":", 1)[1], "--no-dashboard"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = [subprocess.Popen([BIN / "dask", "worker", address, "--nthreads", "1", "--nworkers", "1",
                                 "--no-dashboard", "--name", f"machine-{i}"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        run_dir = tmp_path / "run"
        result = tandem("run", "specs/guess-number.yaml", *TINY, "--set", f"actors.cluster={address}",
                        "--set", f"checkpoint.dir={run_dir}")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        accounting = json.loads((run_dir / "accounting.json").read_text())
        assert accounting["consumed"] == 32 and balanced(accounting)
        with Client(address) as client:  # the workers outlive the run, ready for the next
            assert len(client.scheduler_info()["workers"]) == 2
    finally:
        for process in (*workers, scheduler):
            process.terminate()
        for process in (*workers, scheduler):
            process.wait(timeout=30)


@pytest.mark.slow  # 47 s on 2 cores: CI's time (README, "The two commands")
def test_cluster_class_named_in_the_spec(prefect_api, tmp_path):
    run_dir = tmp_path / "run"
    kwargs = "{n_workers: 0, threads_per_worker: 1, processes: true, dashboard_address: ':0'}"
    result = tandem("run", "specs/guess-number.yaml", *TINY, "--set", "actors.cluster=distributed:LocalCluster",
                    "--set", f"actors.cluster_kwargs={kwargs}", "--set", f"checkpoint.dir={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert balanced(json.loads((run_dir / "accounting.json").read_text()))
