"""The actors' local cluster: its workers' memory limit (`actors.memory_limit`)."""

import pytest

from flows.spec import SpecError, parse_spec
from tasks.actors import cluster as cluster_module
from tasks.actors.cluster import actor_cluster, worker_memory_limit
from tasks.config import ActorsConfig

GIB = 2**30


class FakeCluster:
    """Records the kwargs a LocalCluster is built with."""

    built: list[dict] = []

    def __init__(self, **kwargs):
        FakeCluster.built.append(kwargs)
        self.scheduler_address = "tcp://127.0.0.1:0"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def machine(monkeypatch):
    """A machine of 16 GiB; the LocalCluster recorded, not started."""
    monkeypatch.setattr(cluster_module, "MEMORY_LIMIT", 16 * GIB)
    monkeypatch.setattr(cluster_module, "LocalCluster", FakeCluster)
    FakeCluster.built = []
    return FakeCluster.built


@pytest.mark.parametrize("limit, workers, expected", [
    (None, 4, 2 * GIB),  # half the machine, shared: the learner and the system keep the rest
    (0.25, 2, 2 * GIB),
    ("3GiB", 4, 3 * GIB),  # a size is each worker's
    ("1.5 GB", 1, 1_500_000_000),
])
def test_the_local_clusters_workers_get_the_spec_limit(machine, limit, workers, expected):
    config = ActorsConfig(workers=workers, memory_limit=limit)
    assert worker_memory_limit(config) == expected
    with actor_cluster(config) as address:
        assert address == "tcp://127.0.0.1:0"
    (kwargs,) = machine
    assert kwargs["memory_limit"] == expected and kwargs["n_workers"] == workers


@pytest.mark.parametrize("limit, message", [
    ("lots", "'lots' is not a size; use one such as \"4GiB\""),
    ("0GiB", "must be more than 0 bytes, not '0GiB'"),
    ("1.5", "a fraction of the machine's memory is in (0, 1], not 1.5"),
    ("0", "a fraction of the machine's memory is in (0, 1], not 0;"),
    ("[4, GiB]", "a size such as \"4GiB\", or a fraction of the machine's memory such as 0.5, not [4, 'GiB']"),
    ("true", "a size such as \"4GiB\""),
])
def test_a_memory_limit_of_another_form_is_refused_naming_its_line(limit, message):
    with pytest.raises(SpecError) as e:
        parse_spec(f"name: x\nactors:\n  memory_limit: {limit}\n")
    assert str(e.value.issues[0]).startswith(f"actors.memory_limit (line 3): Value error, {message}"), e.value.issues


def test_a_memory_limit_is_for_the_local_cluster_only():
    with pytest.raises(SpecError) as e:
        parse_spec("actors: {cluster: 'tcp://10.0.0.1:8786', memory_limit: 4GiB}\n")
    assert str(e.value.issues[0]).startswith("actors.memory_limit (line 1): applies to the local cluster only")
    assert ActorsConfig(cluster="tcp://10.0.0.1:8786").memory_limit is None
