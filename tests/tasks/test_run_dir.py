"""RunDir: the run directory's names, its committed versions, and a version's step as its
checkpoint records it."""

import numpy as np

from tasks.run_dir import RunDir
from tasks.runtime.state.checkpoints import Checkpoints


def test_versions_are_the_committed_checkpoints_only(tmp_path):
    run_dir = RunDir(tmp_path)
    assert run_dir.versions() == [] and run_dir.latest_version() is None  # no checkpoints directory yet
    for name in ("3", "12", "13.orbax-checkpoint-tmp-1733", "damaged"):
        (run_dir.checkpoints / name).mkdir(parents=True)
    assert run_dir.versions() == [3, 12] and run_dir.latest_version() == 12


def test_a_versions_step_is_the_one_its_checkpoint_records(tmp_path):
    """Version 5 of a run resumed at another sync.interval: step 14, not 5 × interval."""
    run_dir = RunDir(tmp_path)
    checkpoints = Checkpoints(run_dir.checkpoints, keep=None)
    checkpoints.save(5, {"w": np.zeros(4, np.float32)}, {"version": 5, "step": 14})
    checkpoints.close()
    assert run_dir.checkpoint_step(5) == 14


def test_learner_pid_files_by_host(tmp_path):
    run_dir = RunDir(tmp_path)
    assert run_dir.pid() == tmp_path / "learner.pid" and run_dir.pid(2) == tmp_path / "learner.2.pid"
    assert {run_dir.spec.parent, run_dir.metrics.parent, run_dir.lock.parent} == {tmp_path}
