"""The actor pool over a real local cluster: an actor comes back when its worker dies,
even when that worker was the only one."""

import contextlib
import os
import time
from types import SimpleNamespace

from distributed import Client, LocalCluster

from tasks.actors import pool as pool_module
from tasks.actors.pool import ActorPool
from tasks.buffer.channels import Channels
from tests.support.clusters import tagged_worker
from tests.support.waiting import wait_until


def plays_until_stopped(actor_id, setup):
    """An actor's stand-in: runs for the whole session."""
    time.sleep(600)


def _exit():
    os._exit(1)


def running(client):
    return {key for keys in client.processing().values() for key in keys}


def test_an_actor_whose_only_worker_died_runs_again_on_its_restarted_worker(monkeypatch):
    """Pinned to its worker, it waited in Dask's "no-worker" state for good, and the
    learner for groups."""
    monkeypatch.setattr(pool_module, "run_actor", plays_until_stopped)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        pool = ActorPool(client, SimpleNamespace(channels=Channels("one")), 1, log=print)
        pool.start()
        [actor] = pool.futures
        wait_until(lambda: actor.key in running(client))
        [worker] = client.nthreads()
        with contextlib.suppress(Exception):
            client.run(_exit, workers=[worker])
        wait_until(lambda: set(client.nthreads()) - {worker})  # restarted by its nanny
        wait_until(lambda: actor.key in running(client))
        pool.raise_if_failed()
        client.cancel(pool.futures)


def test_actors_with_resources_run_only_on_the_worker_that_has_them(monkeypatch):
    monkeypatch.setattr(pool_module, "run_actor", plays_until_stopped)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client, tagged_worker(client, "GPU=2", nthreads=2) as gpu_worker:
        pool = ActorPool(client, SimpleNamespace(channels=Channels("gpu")), 2, log=print, resources={"GPU": 1})
        pool.start()
        wait_until(lambda: len(running(client)) == 2)
        assert {key for key in client.processing()[gpu_worker]} == {f.key for f in pool.futures}
        client.cancel(pool.futures)


class Finished:
    """A finished actor future whose result is its timings."""

    status, key = "finished", "actor-0-s"

    def __init__(self, stats):
        self.stats = stats

    def result(self, timeout=None):
        return self.stats


def test_the_actors_timings_stay_out_of_the_users_log(caplog):
    """Internal: the terminal showed an "actor 0: ... prefills {...}" line at the end of
    every run (it shows the learner's INFO, README "The two commands"); at DEBUG instead."""
    said = []
    pool = ActorPool(None, SimpleNamespace(channels=Channels("t")), 1, log=said.append, warn=said.append)
    pool.futures = [Finished({"actor": 0, "groups": 12, "rollout_s": 3.25, "queue_put_s": 0.5, "compile_s": 2.0,
                              "compiles": {"prefill": 1, "suffix": 4, "decode": 1}, "prefix": {"full": 8}})]
    with caplog.at_level("DEBUG", logger="tasks.actors.pool"):
        pool._log_timings()
    assert said == []
    (record,) = caplog.records
    assert record.levelname == "DEBUG" and record.getMessage() == (
        "actor 0: 12 groups, rollout 3.2s, buffer put 0.5s, engine compiled in 2.0s before its first prompt, "
        "engine compiles {'prefill': 1, 'suffix': 4, 'decode': 1}, prefills {'full': 8}")
