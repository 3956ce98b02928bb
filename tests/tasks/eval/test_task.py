"""Where an evaluation plays, on a real cluster: on a worker carrying `eval.resources`
when the spec asks for them (off the actors' worker), and a clear error when none has them."""

import dataclasses
from pathlib import Path

import jax
import pytest
from distributed import Client, LocalCluster, get_task_stream

from flows.spec import parse_spec
from learner.model import init_params
from learner.serialization import params_to_bytes
from tasks.actors.envs import resolve_entrypoint
from tasks.eval.play import EvalSetup
from tasks.eval.prompts import eval_prompts
from tasks.eval.task import EvalCluster, play_on_cluster
from tests.support.clusters import tagged_worker


def setup_asking(resources: dict) -> tuple[EvalSetup, bytes]:
    spec = parse_spec(Path("specs/guess-number.yaml").read_text(), ["eval.every=5", "eval.n=2"])
    prompts = eval_prompts(spec.eval, resolve_entrypoint(spec.env.entrypoint), spec.env.kwargs)
    setup = EvalSetup(spec.eval.model_copy(update={"resources": resources}), spec.env, spec.actors, spec.model,
                      tuple(prompts))
    return setup, params_to_bytes(jax.device_get(init_params(spec.model, 0)))


@pytest.fixture
def cluster_with_an_eval_worker():
    """A local cluster's worker (the actors') and one started with `--resources eval=1`."""
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client, tagged_worker(client, "eval=1", nthreads=1) as eval_worker:
        yield client, eval_worker


def test_an_eval_asking_for_resources_plays_on_the_worker_that_has_them(cluster_with_an_eval_worker):
    client, eval_worker = cluster_with_an_eval_worker
    setup, weights = setup_asking({"eval": 1})
    cluster = EvalCluster(client.scheduler.address)
    try:
        with get_task_stream(client) as stream:
            outcome = play_on_cluster(setup, cluster, weights, 4)
        beside = play_on_cluster(dataclasses.replace(setup, eval=setup.eval.model_copy(update={"resources": {}})),
                                 cluster, weights, 4)
    finally:
        cluster.close()
    assert {t["worker"] for t in stream.data if t["key"].startswith("play_eval")} == {eval_worker}
    assert outcome["scores"]["episodes"] == 2 == len(outcome["episodes"])
    assert outcome["episodes"] == beside["episodes"]  # the same greedy episodes wherever played


def test_an_eval_asking_for_resources_no_worker_has_says_so():
    setup, weights = setup_asking({"eval": 1})
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as local:
        cluster = EvalCluster(local.scheduler_address)
        try:
            with pytest.raises(RuntimeError, match=r"no Dask worker of .* has the resources \{'eval': 1\} "
                                                   r"\(eval.resources\): start one with `dask worker .* "
                                                   r"--resources eval=1`"):
                play_on_cluster(setup, cluster, weights, 4)
        finally:
            cluster.close()
