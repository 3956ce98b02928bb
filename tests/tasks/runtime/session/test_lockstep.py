"""A learner over two processes in lockstep: process 0 takes batches of groups, publishes
and checkpoints; process 1 follows. It trains as one process with the same 4 devices,
minibatches included, and the checkpoint both wrote restores on one process.

The test re-runs this file as a script in two subprocesses (2 CPU devices each, gloo)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
STEPS = 3  # batches of one update each, then a batch of two minibatches
CONFIG = dict(batch_groups=4, buckets=(16,), rows=8, mesh={"data": 2, "fsdp": 2, "tensor": 1})


def _learner(lead: bool, devices=None):
    import jax

    from learner.config import LearnerConfig
    from learner.sharding import make_mesh
    from learner.train import TrainStep, init_train_state
    from tasks.runtime.session.learner import Learner
    from tasks.runtime.session.lockstep import LeadLearner
    from tests.support.groups import TINY_MODEL

    config = LearnerConfig(**CONFIG, minibatches=2)
    mesh = make_mesh(config.mesh, devices=devices or jax.devices())
    state = init_train_state(TINY_MODEL, config, seed=0, mesh=mesh)
    return (LeadLearner if lead else Learner)(TrainStep(TINY_MODEL, config, mesh), state, config), config


def _groups(batch: int):
    from tests.support.groups import make_group

    # Groups of different lengths make rows that differ, so a row trained out of place shows.
    return [make_group(4 * batch + i, rewards=(float(i % 2), 0.5, 1.0 - i % 2), length=4 + 2 * ((i + batch) % 4))
            for i in range(4)]


def _train(learner) -> list[float]:
    losses = []
    for batch in range(STEPS):
        losses += [update.metrics["loss"] for update in learner.step(_groups(batch))]
    return losses


def _flat(params) -> list[np.ndarray]:
    import jax

    return [np.asarray(leaf) for leaf in jax.tree.leaves(params)]


def test_two_processes_in_lockstep_train_and_checkpoint_like_one(tmp_path):
    from learner.multihost import COORDINATOR_ENV, PROCESS_ID_ENV
    from learner.train import abstract_train_state
    from tasks.runtime.state.checkpoints import Checkpoints
    from tasks.runtime.processes.hosts import coordinator_environ
    from tests.support.groups import TINY_MODEL

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(REPO)}
    environs = coordinator_environ(2)
    hosts = [subprocess.Popen([sys.executable, __file__, str(tmp_path)], cwd=REPO, stderr=subprocess.PIPE, text=True,
                              env={**env, **{k: environ[k] for k in (COORDINATOR_ENV, PROCESS_ID_ENV)}})
             for environ in environs]
    import jax

    learner, config = _learner(lead=False, devices=jax.devices()[:4])
    want_losses, want_params = _train(learner), _flat(learner.params())
    for host in hosts:
        _, err = host.communicate(timeout=240)
        assert host.returncode == 0, err[-3000:]
    got = np.load(tmp_path / "leader.npz")
    np.testing.assert_allclose(got["losses"], want_losses, atol=1e-5)
    for j, want in enumerate(want_params):
        np.testing.assert_allclose(got[f"p{j}"], want, atol=1e-5)

    # What the two processes wrote restores here, on one process's 4 devices.
    with_checkpoints = Checkpoints(tmp_path / "checkpoints", keep=None)
    state, record = with_checkpoints.restore(1, abstract_train_state(TINY_MODEL, config, _mesh(config)))
    with_checkpoints.close()
    assert record == {"step": int(state.step)} and int(state.step) == len(want_losses)
    for got_leaf, want in zip(_flat(state.params), want_params):
        np.testing.assert_allclose(got_leaf, want, atol=1e-5)


def _mesh(config):
    import jax

    from learner.sharding import make_mesh

    return make_mesh(config.mesh, devices=jax.devices()[:4])


def _host(run_dir: str) -> None:
    import jax

    from learner import multihost
    from tasks.runtime.session import lockstep
    from tasks.runtime.state.checkpoints import Checkpoints

    multihost.initialize(2)
    lead = jax.process_index() == 0
    learner, config = _learner(lead)
    checkpoints = (lockstep.LeadCheckpoints if lead else Checkpoints)(Path(run_dir) / "checkpoints", keep=None)
    if not lead:
        return lockstep.follow(learner, checkpoints, config.minibatches)
    losses = _train(learner)
    params = _flat(learner.params())
    checkpoints.save(1, learner.state(), {"step": learner.step_count})
    lockstep.announce(lockstep.STOP)
    checkpoints.close()
    np.savez(Path(run_dir) / "leader.npz", losses=losses, **{f"p{j}": p for j, p in enumerate(params)})


if __name__ == "__main__":
    _host(sys.argv[1])
