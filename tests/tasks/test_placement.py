"""Placement: the scheduler a cluster field names, workers by resource, one environment per
process of a multi-process JAX program."""

import pytest
from distributed import Client, LocalCluster

from learner.multihost import COORDINATOR_ENV, PROCESS_ID_ENV
from tasks.placement import free_port, process_environ, scheduler, workers_with


def test_an_address_is_the_scheduler_itself():
    with scheduler("tcp://10.0.0.1:8786", {}, workers=4, field="actors.cluster") as address:
        assert address == "tcp://10.0.0.1:8786"


def test_a_cluster_class_is_started_scaled_and_closed():
    with scheduler("distributed:LocalCluster", {"n_workers": 0, "processes": False, "dashboard_address": ":0"},
                   workers=2, field="learner.cluster") as address, Client(address) as client:
        client.wait_for_workers(2, timeout=60)
        assert len(client.scheduler_info()["workers"]) == 2


def test_a_cluster_class_that_does_not_load_names_its_field():
    with pytest.raises(ValueError, match="^learner.cluster: "):
        with scheduler("no_such_module_q7:Cluster", {}, workers=1, field="learner.cluster"):
            pass


def test_workers_with_at_least_the_resources_asked_and_all_workers_for_none():
    with (LocalCluster(n_workers=2, processes=False, dashboard_address=":0", resources={"learner": 1}) as cluster,
          Client(cluster) as client):
        client.wait_for_workers(2, timeout=60)
        every = workers_with(client, {})
        assert list(every) == sorted(cluster.scheduler_info["workers"]) and len(every) == 2
        assert workers_with(client, {"learner": 1}) == every
        assert workers_with(client, {"learner": 2}) == {} and workers_with(client, {"GPU": 1}) == {}


def test_one_environment_per_process_and_none_for_one():
    assert process_environ("127.0.0.1:1234", 1) == [{}]
    assert process_environ("h:5", 2) == [{COORDINATOR_ENV: "h:5", PROCESS_ID_ENV: "0"},
                                         {COORDINATOR_ENV: "h:5", PROCESS_ID_ENV: "1"}]
    assert 0 < free_port("127.0.0.1") < 65536
