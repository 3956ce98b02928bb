"""Weight publishing over a real Dask cluster: in the background, newest first, one fetch
per version per worker process, and failures surfaced to the learner."""

import threading

import numpy as np
import pytest
from distributed import Client, LocalCluster, get_client

from tasks.actors.weights import WeightSubscriber
from tasks.runtime.weights import WeightPublisher


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=4, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


def test_published_version_is_visible_after_wait(client):
    publisher = WeightPublisher("w-visible", client)
    publisher.publish(3, {"w": np.full(4, 3.0)})
    publisher.wait()
    version, params = WeightSubscriber("w-visible", client).latest()
    assert version == 3 and params["w"].tolist() == [3.0] * 4
    assert WeightSubscriber("w-visible", client).version() == 3
    publisher.close()


def test_only_the_newest_waiting_version_is_sent(client):
    sent = []
    publisher = WeightPublisher("w-newest", client, on_sent=sent.append)
    sending = threading.Event()
    release = threading.Event()
    send = publisher._send

    def slow_send(version, params):  # holds the first send until three more versions wait
        sending.set()
        release.wait(10)
        send(version, params)

    publisher._send = slow_send
    publisher.publish(1, {"w": np.ones(2)})
    assert sending.wait(10)
    for version in (2, 3, 4):
        publisher.publish(version, {"w": np.full(2, float(version))})
    release.set()
    publisher.close()  # flushes what is waiting
    assert publisher.skipped == 2  # versions 2 and 3 were superseded before they left
    assert sent == [1, 4]  # what admission control may count on
    assert WeightSubscriber("w-newest", client).latest()[0] == 4


LOADS = []  # module-level: tasks are pickled by reference to it


def _actor(_):
    subscriber = WeightSubscriber("w-shared", get_client(), load=lambda p: LOADS.append(1) or p)
    return [subscriber.latest()[0] for _ in range(3)]


def test_actors_of_a_process_share_one_loaded_copy_per_version(client):
    publisher = WeightPublisher("w-shared", client)
    publisher.publish(0, {"w": np.zeros(3)})
    publisher.wait()
    assert client.gather(client.map(_actor, range(4), pure=False)) == [[0, 0, 0]] * 4
    assert len(LOADS) == 1
    publisher.publish(1, {"w": np.ones(3)})
    publisher.wait()
    assert client.gather(client.map(_actor, range(4, 8), pure=False)) == [[1, 1, 1]] * 4
    assert len(LOADS) == 2
    publisher.close()


def test_a_failed_send_is_raised_at_the_learners_next_call(client):
    publisher = WeightPublisher("w-failing", client)

    def broken(version, params):
        raise ConnectionError("scheduler gone")

    publisher._send = broken
    publisher.publish(1, {"w": np.ones(1)})
    with pytest.raises(RuntimeError, match="publishing weights failed: ConnectionError"):
        publisher.wait()
    with pytest.raises(RuntimeError, match="scheduler gone"):
        publisher.publish(2, {"w": np.ones(1)})
    publisher.close()
