"""What the two-host learner end-to-end tests check, wherever the two processes run
(`learner.cluster: local`, or workers of a Dask cluster): that they train as one process
with the same devices, and that killing one mid-run fails the attempt, whose retry
restarts both from the latest checkpoint with nothing lost and nothing trained twice."""

import os
import re
import signal
import subprocess
import sys

import numpy as np

from tasks.buffer.ledger import balanced
from tests.conftest import ROOT, tandem
from tests.flows.test_faults_e2e import finish, records, wait_for

MESH = "learner.mesh={data: 2, fsdp: 2, tensor: 1}"
# Fixed data: the synchronous mode plays one batch (prompts 0-3, no filter) with the first
# weights, then trains on it for 3 epochs: 3 steps, whatever the order the groups arrive in.
FIXED = ["--set", "learner.mode=sync", "--set", "learner.epochs=3", "--set", "sync.interval=3",
         "--set", "learner.steps=3", "--set", "learner.batch_groups=4", "--set", "buffer.filters=[]",
         "--set", MESH]


def devices(count: int) -> dict:
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}", "PYTHONPATH": str(ROOT)}


def checkpointed(run_dir) -> int:
    """The latest version checkpointed so far (0 for none)."""
    versions = [int(p.name) for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit()]
    return max(versions, default=0)


def final_params(run_dir, version: int) -> list[np.ndarray]:
    import jax

    from flows.spec import load_spec
    from learner.config import MeshConfig
    from learner.sharding import make_mesh
    from learner.train import abstract_train_state
    from tasks.runtime.state.checkpoints import Checkpoints

    spec = load_spec(run_dir / "spec.yaml")
    mesh = make_mesh(MeshConfig(data=1), devices=jax.devices()[:1])
    checkpoints = Checkpoints(run_dir / "checkpoints", keep=None)
    state, _ = checkpoints.restore(version, abstract_train_state(spec.model, spec.learner, mesh))
    checkpoints.close()
    return [np.asarray(leaf) for leaf in jax.tree.leaves(state.params)]


def check_two_hosts_train_as_one(tmp_path, placement: list[str]) -> None:
    """One process of 4 devices, then two of 2 placed by `placement` (`--set` arguments),
    train the same fixed batch to the same losses and weights."""
    runs = {}
    for hosts, where, per_host in ((1, [], 4), (2, placement, 2)):
        run_dir = tmp_path / f"hosts-{hosts}"
        result = tandem("run", "specs/guess-number.yaml", *FIXED, "--set", f"learner.hosts={hosts}", *where,
                        "--set", f"checkpoint.dir={run_dir}", env=devices(per_host), timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[hosts] = run_dir
    (one, _), (two, accounting) = records(runs[1]), records(runs[2])
    assert [sorted(m["prompt_ids"]) for m in one + two] == [[0, 1, 2, 3]] * 6
    for field in ("loss", "padding", "grad_norm"):
        np.testing.assert_allclose([m[field] for m in two], [m[field] for m in one], atol=1e-5)
    for got, want in zip(final_params(runs[2], 1), final_params(runs[1], 1)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert balanced(accounting) and accounting["consumed"] == 4


def check_a_killed_host_is_retried(tmp_path, placement: list[str]) -> None:
    """Kills learner process 1 (placed by `placement`) once two versions are checkpointed:
    the attempt fails, the retry resumes both mid-run, and every step and group is
    trained exactly once."""
    run_dir, steps = tmp_path / "run", 24
    command = [os.path.join(os.path.dirname(sys.executable), "tandem"), "run", "specs/guess-number.yaml",
               "--set", "learner.batch_groups=4", "--set", "buffer.capacity=8", "--set", "sync.interval=4",
               "--set", "checkpoint.every=1", "--set", f"learner.steps={steps}", "--set", "learner.hosts=2",
               *placement, "--set", f"checkpoint.dir={run_dir}"]
    log = tmp_path / "run.log"
    process = subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                               env={**os.environ, **devices(1)}, start_new_session=True)
    wait_for(lambda: checkpointed(run_dir) >= 2 and (run_dir / "learner.1.pid").exists(), process)
    os.kill(int((run_dir / "learner.1.pid").read_text()), signal.SIGKILL)
    output = finish(process, log)

    assert "learner process 1 died (exit code -9)" in output
    resumed_at = int(re.search(r"resumed from \S+: step (\d+)", output).group(1))
    assert 8 <= resumed_at < steps  # mid-run, from a checkpoint both processes wrote
    metrics, accounting = records(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert accounting["consumed"] == steps * 4 and balanced(accounting)  # none twice, none lost
