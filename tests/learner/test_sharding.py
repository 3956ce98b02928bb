import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

from learner.batching import make_batch
from learner.config import LearnerConfig, LossConfig, MeshConfig, ModelConfig
from learner.sharding import batch_sharding, make_mesh, weight_spec
from learner.train import TrainStep, abstract_train_state, init_train_state, params_numpy
from learner.trajectory import Sample

MODEL = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
LEARNER = LearnerConfig(buckets=(16,))


@pytest.fixture(scope="module", autouse=True)
def eight_devices():
    if jax.device_count() != 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/conftest.py)")


def _mesh(data, fsdp, tensor):
    return make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor), devices=jax.devices()[: data * fsdp * tensor])


def test_make_mesh_fills_the_data_axis():
    mesh = make_mesh(MeshConfig(data=-1, fsdp=2, tensor=2))
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}


@pytest.mark.parametrize("axes", [(-1, 3, 1), (2, 2, 1), (4, 2, 2)])
def test_make_mesh_rejects_a_mismatch_with_the_devices(axes):
    data, fsdp, tensor = axes
    with pytest.raises(ValueError, match="does not match the 8 available devices"):
        make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor))


def test_weight_specs():
    mesh = _mesh(2, 2, 2)
    assert weight_spec(["blocks", "0", "attn", "q", "kernel"], (64, 64), mesh) == P("fsdp", "tensor")
    assert weight_spec(["blocks", "0", "mlp", "down", "kernel"], (256, 64), mesh) == P("tensor", "fsdp")
    assert weight_spec(["embed", "embedding"], (100, 64), mesh) == P("tensor", "fsdp")
    assert weight_spec(["final_norm", "scale"], (64,), mesh) == P("fsdp")
    assert weight_spec(["final_norm", "scale"], (64,), _mesh(8, 1, 1)) == P(None)
    # Indivisible dimensions stay whole: 100 rows over 8 devices, 3 columns over 2.
    assert weight_spec(["embed", "embedding"], (100, 64), _mesh(1, 8, 1)) == P(None, "fsdp")
    assert weight_spec(["blocks", "0", "attn", "q", "kernel"], (64, 3), mesh) == P("fsdp", None)
    assert batch_sharding(mesh).spec == P(("data", "fsdp"), None)


def _batch():
    rng = np.random.default_rng(0)
    samples = []
    for n in rng.integers(4, 16, size=12):
        tokens = np.concatenate([[1], rng.integers(3, MODEL.vocab_size, n - 1)]).astype(np.int32)
        versions = np.where(np.arange(n) < 2, -1, 0).astype(np.int32)
        logprobs = np.where(versions >= 0, rng.uniform(-5.0, -4.0, n), 0.0).astype(np.float32)
        samples.append(Sample(tokens, logprobs, versions, reward=0.0))
    return make_batch(samples, rng.normal(size=len(samples)), LEARNER.buckets, rows=8)


def _train(mesh, batch, steps=3):
    state = init_train_state(MODEL, LEARNER, seed=0, mesh=mesh)
    step = TrainStep(MODEL, LEARNER, mesh)
    for _ in range(steps):
        state, metrics = step(state, batch)
    return metrics["loss"], params_numpy(state), state


@pytest.fixture(scope="module")
def single_device_run():
    return _train(_mesh(1, 1, 1), _batch())


@pytest.mark.parametrize("axes", [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 8, 1)])
def test_sharded_steps_match_one_device(axes, single_device_run):
    loss, params, _ = single_device_run
    sharded_loss, sharded_params, state = _train(_mesh(*axes), _batch())
    assert sharded_loss == pytest.approx(loss, abs=1e-5)
    for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(sharded_params)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert state.params["blocks"][0]["attn"]["q"]["kernel"].sharding.mesh.shape == dict(
        zip(("data", "fsdp", "tensor"), axes)
    )
    # Every parameter byte on fsdp x tensor devices once (norm scales, replicated, aside).
    leaves = jax.tree.leaves(state.params)
    per_device = sum(x.addressable_shards[0].data.nbytes for x in leaves)
    total = sum(x.nbytes for x in leaves)
    assert per_device == pytest.approx(total / (axes[1] * axes[2]), rel=0.02)


def test_a_tensor_only_mesh_steps_match_one_device(single_device_run):
    """data = fsdp = 1 beside tensor = 8: the mesh XLA's partitioner needs the vmap path for."""
    loss, params, _ = single_device_run
    sharded_loss, sharded_params, state = _train(_mesh(1, 1, 8), _batch())
    assert sharded_loss == pytest.approx(loss, abs=1e-5)
    for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(sharded_params)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert state.params["blocks"][0]["mlp"]["up"]["kernel"].sharding.spec == P(None, "tensor")


def test_parameters_and_moments_are_split_over_fsdp_and_tensor():
    mesh = _mesh(2, 2, 2)
    state = init_train_state(ModelConfig(), LEARNER, seed=0, mesh=mesh)
    for tree in (state.params, optax.tree.get(state.opt_state, "mu")):
        matrices = [x for x in jax.tree.leaves(tree) if x.ndim == 2]
        total = sum(x.nbytes for x in matrices)
        per_device = sum(x.addressable_shards[0].data.nbytes for x in matrices)
        assert per_device == total // 4


def test_rows_must_divide_over_the_batch_axes():
    mesh = _mesh(8, 1, 1)
    n = 4
    sample = Sample(np.arange(1, n + 1, dtype=np.int32), np.zeros(n, np.float32), np.zeros(n, np.int32), 0.0)
    batch = make_batch([sample], [1.0], LEARNER.buckets, rows=4)
    with pytest.raises(ValueError, match=r"rows \(4\) must be divisible by mesh data x fsdp \(8\)"):
        TrainStep(MODEL, LEARNER, mesh)(init_train_state(MODEL, LEARNER, seed=0, mesh=mesh), batch)



def test_a_checkpoint_restores_onto_a_different_mesh(tmp_path):
    learner = LEARNER.model_copy(update={"loss": LossConfig(kl_coef=0.1)})  # a reference too
    saved = init_train_state(MODEL, learner, seed=3, mesh=_mesh(2, 2, 2))
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with ocp.CheckpointManager(tmp_path, options=options) as manager:
        manager.save(1, args=ocp.args.StandardSave(saved))
        manager.wait_until_finished()
        target = abstract_train_state(MODEL, learner, _mesh(1, 8, 1))
        restored = manager.restore(1, args=ocp.args.StandardRestore(target))
    assert jax.tree.structure(restored) == jax.tree.structure(saved)
    for want, got, abstract in zip(jax.tree.leaves(saved), jax.tree.leaves(restored), jax.tree.leaves(target)):
        assert got.sharding == abstract.sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
