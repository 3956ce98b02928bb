"""Two processes x 2 CPU devices (gloo collectives) train exactly as one process x 4 devices.

The test re-runs this file as a script in two subprocesses that join through
`jax.distributed`; each feeds its half of the batch's rows.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

MESH_AXES = {"data": 2, "fsdp": 2, "tensor": 1}
REPO = Path(__file__).resolve().parents[2]


def _batch(model, buckets):
    from learner.batching import make_batch
    from learner.trajectory import Sample

    rng = np.random.default_rng(0)
    samples = []
    for n in rng.integers(4, 16, size=8):
        tokens = np.concatenate([[1], rng.integers(3, model.vocab_size, n - 1)]).astype(np.int32)
        versions = np.where(np.arange(n) < 2, -1, 0).astype(np.int32)
        logprobs = np.where(versions >= 0, rng.uniform(-5.0, -4.0, n), 0.0).astype(np.float32)
        samples.append(Sample(tokens, logprobs, versions, reward=0.0))
    return make_batch(samples, rng.normal(size=len(samples)), buckets, rows=8)


def _train(devices=None) -> tuple[float, list[np.ndarray]]:
    """Three steps on a (2, 2, 1) mesh; the loss of the last and the final parameters."""
    import jax

    from learner import multihost
    from learner.config import LearnerConfig, MeshConfig, ModelConfig
    from learner.sharding import make_mesh
    from learner.train import TrainStep, init_train_state, params_numpy

    model, learner = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64), LearnerConfig(buckets=(16,))
    mesh = make_mesh(MeshConfig(**MESH_AXES), devices=devices)
    state = init_train_state(model, learner, seed=0, mesh=mesh)
    step = TrainStep(model, learner, mesh)
    local = multihost.host_batch(_batch(model, learner.buckets))
    for _ in range(3):
        state, metrics = step(state, local)
    return metrics["loss"], jax.tree.leaves(params_numpy(state))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one(tmp_path):
    import jax

    port = _free_port()
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(REPO), "TANDEM_COORDINATOR_ADDRESS": f"localhost:{port}"}
    workers = [
        subprocess.Popen([sys.executable, __file__, str(tmp_path / f"{i}.npz")], cwd=REPO,
                         env={**env, "TANDEM_PROCESS_ID": str(i)}, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    want_loss, want_params = _train(jax.devices()[:4])
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-3000:]
    for i in range(2):
        got = np.load(tmp_path / f"{i}.npz")
        assert float(got["loss"]) == pytest.approx(want_loss, abs=1e-5)
        for j, want in enumerate(want_params):
            np.testing.assert_allclose(got[f"p{j}"], want, atol=1e-5)


def _worker(out: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from learner import multihost

    multihost.initialize(hosts=2)
    if jax.process_count() != 2 or jax.device_count() != 4:
        raise SystemExit(f"expected 2 processes x 2 devices, got {jax.process_count()} and {jax.device_count()}")
    loss, params = _train()
    np.savez(out, loss=loss, **{f"p{j}": p for j, p in enumerate(params)})


if __name__ == "__main__":
    _worker(sys.argv[1])
