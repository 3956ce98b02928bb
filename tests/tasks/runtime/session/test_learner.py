"""The learner alone: a batch of groups in, `minibatches × epochs` updates out."""

import jax
import numpy as np
import pytest

from learner.config import LearnerConfig, MeshConfig
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state
from tasks.runtime.session.learner import Learner
from tests.support.groups import TINY_MODEL, make_group


def make_learner(**config) -> Learner:
    config = LearnerConfig(batch_groups=2, buckets=(16,), **config)
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    return Learner(TrainStep(TINY_MODEL, config, mesh), init_train_state(TINY_MODEL, config, seed=0, mesh=mesh), config)


@pytest.mark.parametrize("minibatches, epochs", [(1, 1), (2, 2)])
def test_a_batch_yields_one_update_per_minibatch_and_epoch(minibatches, epochs):
    learner = make_learner(minibatches=minibatches, epochs=epochs, rows=4)
    groups = [make_group(0), make_group(1, rewards=(1.0, 0.0))]
    updates = list(learner.step(groups))
    assert [u.step for u in updates] == list(range(1, minibatches * epochs + 1))
    assert learner.step_count == minibatches * epochs
    assert all(u.train_s > 0 and {"loss", "padding", "entropy"} <= u.metrics.keys() for u in updates)


def test_updates_move_the_published_weights_and_restore_puts_them_back():
    learner = make_learner()
    before = _flat(learner.params())
    assert all(isinstance(a, np.ndarray) for a in before.values())
    for _ in learner.step([make_group(0), make_group(1)]):
        pass
    after = _flat(learner.params())
    assert any(not np.allclose(before[k], after[k]) for k in before)
    learner.restore(make_learner().state())  # a fresh state of the same seed
    assert learner.step_count == 0
    assert all(np.allclose(before[k], v) for k, v in _flat(learner.params()).items())


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}/{key}").items()}
    return {prefix: tree}
