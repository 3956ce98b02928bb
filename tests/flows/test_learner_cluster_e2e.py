"""A learner of two processes on a separately started Dask scheduler and two workers with the
`learner` resource (`learner.cluster: tcp://...`), launched by `tandem run` through Prefect:
it trains as one process with the same devices, and a learner process killed on its worker
fails the attempt, whose retry restarts both from the latest checkpoint."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port
from tests.support.two_hosts import (
    check_a_killed_host_is_retried,
    check_two_hosts_train_as_one,
    devices,
)

pytestmark = pytest.mark.e2e
DASK = str(Path(sys.executable).parent / "dask")


@pytest.fixture
def learner_pool(tmp_path):
    """A `dask scheduler` and two `dask worker --resources learner=1` of 2 CPU devices each;
    the scheduler's address. All are stopped after the test."""
    from distributed import Client

    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, **devices(2)}
    logs = tmp_path / "pool.log"
    commands = [[DASK, "scheduler", "--host", "127.0.0.1", "--port", address.rpartition(":")[2], "--no-dashboard"]]
    commands += [[DASK, "worker", address, "--resources", "learner=1", "--nthreads", "1", "--no-dashboard"]] * 2
    processes = []
    try:
        for command in commands:
            processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=logs.open("a"),
                                              stderr=subprocess.STDOUT, start_new_session=True))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.mark.slow  # 69 s on 2 cores: CI's time (README, "The two commands")
def test_two_hosts_on_dask_workers_train_as_one_process_with_the_same_devices(prefect_api, learner_pool, tmp_path):
    check_two_hosts_train_as_one(tmp_path, placement=["--set", f"learner.cluster={learner_pool}"])


@pytest.mark.slow  # 2-4 min on 2 cores (measured 136 s and 258 s), as the local kill test
def test_a_learner_process_killed_on_its_worker_fails_the_attempt_and_the_retry_restarts_both(
        prefect_api, learner_pool, tmp_path):
    check_a_killed_host_is_retried(tmp_path, placement=["--set", f"learner.cluster={learner_pool}"])
