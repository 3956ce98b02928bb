"""The weight source: versions, cadence and publishing in the background, alone (a fake
transport stands for the network) and over a real Dask cluster with the learner's weight
server (one fetch per version per worker process, failures surfaced to the learner)."""

import socket
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, Variable, get_client

from tasks.actors.weights import WeightFollower
from tasks.buffer.channels import Channels
from tasks.runtime.session.weights import HttpTransport, WeightSource


class FakeTransport:
    """Crosses no process: records what was sent; `hold` blocks the next send until released."""

    def __init__(self):
        self.sent, self.hold, self.sending = [], threading.Event(), threading.Event()
        self.hold.set()

    def send(self, version, params):
        self.sending.set()
        assert self.hold.wait(10)
        self.sent.append((version, params["w"].tolist()))

    def close(self):
        pass


def test_a_version_every_interval_steps_counted_from_the_restored_one():
    source = WeightSource(FakeTransport(), interval=4, version=7)
    assert [step for step in range(1, 13) if source.due(step)] == [4, 8, 12]
    assert (source.current, source.visible) == (7, 7)
    source.start()
    assert source.publish({"w": np.zeros(1)}, new_version=False) == 7  # a session's start
    assert source.publish({"w": np.ones(1)}) == 8
    source.wait()
    assert (source.current, source.visible) == (8, 8)
    source.stop()


def test_visible_moves_only_once_the_actors_can_use_the_version():
    transport = FakeTransport()
    source = WeightSource(transport, interval=1).start()
    transport.hold.clear()
    source.publish({"w": np.ones(1)})
    assert transport.sending.wait(10)
    assert (source.current, source.visible) == (1, 0)  # staleness counts it, admission does not yet
    transport.hold.set()
    source.wait()
    assert source.visible == 1
    source.stop()


def test_only_the_newest_waiting_version_is_sent():
    transport = FakeTransport()
    source = WeightSource(transport, interval=1).start()
    transport.hold.clear()
    source.publish({"w": np.full(1, 1.0)})
    assert transport.sending.wait(10)
    for version in (2, 3, 4):
        source.publish({"w": np.full(1, float(version))})
    transport.hold.set()
    source.wait()
    assert source.skipped == 2  # versions 2 and 3 were superseded before they left
    assert transport.sent == [(1, [1.0]), (4, [4.0])]
    source.stop()


def test_stop_flushes_the_version_waiting():
    transport = FakeTransport()
    source = WeightSource(transport, interval=1).start()
    source.publish({"w": np.ones(1)})
    assert source.stop()
    assert transport.sent == [(1, [1.0])]


def test_a_failed_send_is_raised_at_the_learners_next_call():
    class Broken:
        def send(self, version, params):
            raise ConnectionError("scheduler gone")

        def close(self):
            pass

    source = WeightSource(Broken(), interval=1).start()
    source.publish({"w": np.ones(1)})
    with pytest.raises(RuntimeError, match="weight-publisher failed: ConnectionError"):
        source.wait()
    with pytest.raises(RuntimeError, match="scheduler gone"):
        source.publish({"w": np.ones(1)})
    source.stop()


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=4, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        yield client


def follow(channels, client, **kwargs):
    """A follower that records every version handed on."""
    seen = []
    follower = WeightFollower(channels, client, lambda v, p: seen.append((v, p["w"].tolist())), **kwargs)
    return follower.start(), seen


def test_published_versions_reach_a_follower_over_the_learners_server(client):
    channels = Channels("visible")
    source = WeightSource(HttpTransport(channels, client), interval=1, version=2).start()
    source.publish({"w": np.full(4, 3.0)})
    source.wait()
    follower, seen = follow(channels, client, poll_s=0.01)
    assert follower.wait_first(30)[0] == 3 and seen == [(3, [3.0] * 4)]
    source.publish({"w": np.full(4, 4.0)})
    source.wait()
    deadline = time.monotonic() + 30
    while len(seen) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert seen == [(3, [3.0] * 4), (4, [4.0] * 4)]  # each version once, in order
    follower.stop()
    source.stop()


def test_a_stuck_poll_is_raised_naming_where_it_waits(client):
    """A learner that accepts the fetch and never answers: an actor waiting for a version
    is told, with the follower's stack, instead of waiting for ever."""
    channels = Channels("stuck")
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connections queue, never answered
        Variable(channels.weights_version, client=client).set(
            {"version": 1, "url": f"http://127.0.0.1:{silent.getsockname()[1]}/v1"})
        follower, seen = follow(channels, client)
        follower.raise_if_stuck(stuck_s=0.5)  # a poll in progress, not yet overdue
        time.sleep(1.0)
        where = r"its thread waits in _run \(weights.py:\d+\) -> _fetch \(weights.py:\d+\) -> urlopen .* -> readinto"
        with pytest.raises(RuntimeError, match=r"has not returned in 1s \(latest version loaded: None\); " + where):
            follower.raise_if_stuck(stuck_s=0.5)
    follower.stop()  # the server gone, the fetch fails and the thread ends
    assert seen == []


def _kill_worker():
    import os

    os._exit(1)


def test_weights_survive_the_death_of_any_dask_worker():
    """The learner serves the weights itself: no worker holds the only copy, so a worker
    that dies (as a fault test kills one) leaves every actor able to fetch them."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        channels = Channels("survive")
        source = WeightSource(HttpTransport(channels, client), interval=1).start()
        source.publish({"w": np.full(2, 5.0)}, new_version=False)
        source.wait()
        workers = list(client.scheduler_info()["workers"])
        try:
            client.run(_kill_worker, workers=workers[:1])
        except Exception:
            pass
        survivor = workers[1]
        fetched = client.submit(_latest, channels, workers=[survivor], pure=False).result(timeout=60)
        assert fetched == (0, [5.0, 5.0])
        source.stop()


def _latest(channels):
    follower = WeightFollower(channels, get_client(), lambda v, p: None).start()
    version, params = follower.wait_first(30)
    follower.stop()
    return version, params["w"].tolist()
