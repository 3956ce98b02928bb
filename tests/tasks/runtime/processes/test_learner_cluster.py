"""Learner processes on Dask workers with the `learner` resource (`tasks.runtime.processes.learner_cluster`),
with real worker processes (nanny'd, so daemonic) and small programs in place of the learner:
the leader's events arrive in order and end, the stop flag reaches it, a process that dies or a
worker that dies fails the attempt, and whatever still runs is killed when it is stopped."""

import functools
import os
import pickle
import signal
import time
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from learner.config import LearnerConfig
from tasks.runtime.processes.learner_cluster import ClusterProcesses, cluster_environ, learner_client, learner_workers
from tests.support.learner_programs import follower, leader
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"learner": 1},
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        yield client


def placed(client, tmp_path, session) -> ClusterProcesses:
    workers = learner_workers(client, 2)
    mains = [pickle.dumps(functools.partial(leader, tmp_path)),
             pickle.dumps(functools.partial(follower, tmp_path, "end"))]
    processes = ClusterProcesses(client, workers, mains, session)
    processes.start()
    return processes


def events_until(processes, kind, timeout_s=60):
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline and not processes.events.gone:
        if (event := processes.events.get(timeout_s=0.2)) is not None:
            seen.append(event)
            if event[0] == kind:
                return seen
    raise AssertionError(f"no {kind} event: {seen}")


def alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except ProcessLookupError:
        return False


def test_the_leaders_events_arrive_in_order_and_the_stop_flag_reaches_it(client, tmp_path):
    processes = placed(client, tmp_path, "s1")
    assert events_until(processes, "progress") == [("log", ("info", "hello", False)), ("progress", {"step": 1})]
    assert not processes.failed()
    processes.stop_flag.set()
    assert events_until(processes, "done")[-1] == ("done", {"stopped": "interrupted"})
    (tmp_path / "end").touch()  # the follower's STOP
    wait_until(lambda: processes.events.get(timeout_s=0.2) is None and processes.events.gone)
    processes.stop(grace_s=30)
    assert not processes.failed() and processes.death() == "learner process died (exit code 0)"
    processes.events.close()


def test_a_follower_killed_fails_the_attempt_and_stop_kills_the_leader(client, tmp_path):
    processes = placed(client, tmp_path, "s2")
    events_until(processes, "progress")
    wait_until(lambda: (tmp_path / "follower.pid").exists())
    os.kill(int((tmp_path / "follower.pid").read_text()), signal.SIGKILL)
    wait_until(processes.failed)
    assert processes.death() == "learner process 1 died (exit code -9)"
    processes.stop(grace_s=30)  # the leader cannot end by itself: its Dask task kills it
    wait_until(lambda: not alive(tmp_path / "leader.pid"), timeout_s=10)
    processes.events.close()


def test_a_worker_killed_fails_the_attempt_and_its_learner_process_dies_with_it(client, tmp_path):
    processes = placed(client, tmp_path, "s3")
    events_until(processes, "progress")
    wait_until(lambda: (tmp_path / "follower.pid").exists())
    worker = list(processes._workers)[1]
    os.kill(client.run(os.getpid, workers=[worker])[worker], signal.SIGKILL)  # its nanny starts another
    wait_until(processes.failed, timeout_s=10)
    assert processes.death() == f"learner process 1's host left the Dask cluster (worker {worker})"
    wait_until(lambda: not alive(tmp_path / "follower.pid"), timeout_s=10)  # its stdin, from the worker, ended
    processes.stop(grace_s=30)
    wait_until(lambda: not alive(tmp_path / "leader.pid"), timeout_s=10)
    processes.events.close()
    client.wait_for_workers(2, timeout=60)


def test_too_few_learner_workers_is_an_error_that_says_how_to_start_them(client):
    with pytest.raises(RuntimeError, match=r"has 2 worker\(s\) with the `learner` resource.*--resources learner=1"):
        learner_workers(client, 3, wait_s=0)


def test_the_coordinator_is_on_process_0s_host(client):
    workers = learner_workers(client, 2)
    environs = cluster_environ(client, workers)
    host = next(iter(workers.values()))["host"]
    assert [e["TANDEM_PROCESS_ID"] for e in environs] == ["0", "1"]
    assert {e["TANDEM_COORDINATOR_ADDRESS"].rpartition(":")[0] for e in environs} == {host}


def test_a_cluster_class_is_built_and_scaled_to_the_hosts():
    config = LearnerConfig(hosts=2, cluster="distributed:LocalCluster",
                           cluster_kwargs={"n_workers": 0, "threads_per_worker": 1, "resources": {"learner": 1},
                                           "dashboard_address": ":0"})
    with learner_client(config) as client:
        assert len(learner_workers(client, 2)) == 2
