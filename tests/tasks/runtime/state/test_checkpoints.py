"""Checkpoints: round trip, keep-N, and a disk that fills up mid-save."""

import errno
import os
import subprocess

import jax
import numpy as np
import pytest

from tasks.runtime.state.checkpoints import Checkpoints
from tasks.runtime.session.failures import Unrecoverable


def state(value: float, size: int = 1000):
    """Random (incompressible) weights offset by `value`."""
    w = np.random.default_rng(int(value)).random(size, dtype=np.float32) + value
    return {"params": {"w": w}, "step": np.int32(value)}


def abstract(size: int = 1000):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), state(0.0, size))


def test_round_trip_and_keep(tmp_path):
    checkpoints = Checkpoints(tmp_path / "checkpoints", keep=2)
    for version in (1, 2, 3):
        checkpoints.save(version, state(version), {"version": version, "data": {"cursor": version * 10}})
    assert checkpoints.versions() == [2, 3] and checkpoints.latest_version() == 3
    restored, record = checkpoints.restore(3, abstract())
    assert np.array_equal(restored["params"]["w"], state(3)["params"]["w"])
    assert record["data"] == {"cursor": 30}
    checkpoints.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs: a real filesystem that runs out of space."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_leaves_the_previous_checkpoint_intact(small_disk):
    size = 500_000  # 2 MB of float32 per checkpoint
    checkpoints = Checkpoints(small_disk / "checkpoints", keep=None)
    checkpoints.save(1, state(1.0, size), {"version": 1})
    checkpoints.wait()  # committed before the disk fills
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * (free - 1_000_000))  # room for half a checkpoint
    with pytest.raises(Unrecoverable, match="the disk is full"):  # from the write in the background, at the latest on wait
        checkpoints.save(2, state(2.0, size), {"version": 2})
        checkpoints.wait()
    filler.unlink()

    reopened = Checkpoints(small_disk / "checkpoints", keep=None)
    assert reopened.versions() == [1]  # the half-written version is not a checkpoint
    restored, record = reopened.restore(1, abstract(size))
    assert np.array_equal(restored["params"]["w"], state(1.0, size)["params"]["w"])
    assert record == {"version": 1}
    reopened.save(2, state(2.0, size), {"version": 2})  # and saving works again
    reopened.wait()
    assert reopened.versions() == [1, 2]
    reopened.close()


def test_a_full_disk_is_unrecoverable_and_says_the_previous_checkpoints_are_intact(tmp_path, monkeypatch):
    """ENOSPC from Orbax's write: a retry seconds later finds the disk as full."""
    checkpoints = Checkpoints(tmp_path / "checkpoints", keep=None)
    checkpoints.save(1, state(1.0), {"version": 1})
    checkpoints.wait()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints._manager, "save", full)
    with pytest.raises(Unrecoverable) as e:
        checkpoints.save(2, state(2.0), {"version": 2})
    assert str(e.value) == (
        f"writing checkpoint 2 in {checkpoints.directory}: the disk is full (No space left on device); "
        "the previous checkpoints are intact (the latest: version 1): free some space, then resume the run")
    assert isinstance(e.value.__cause__, OSError)
    monkeypatch.undo()
    assert checkpoints.versions() == [1]
    checkpoints.close()


def test_other_write_errors_stay_retriable(tmp_path, monkeypatch):
    checkpoints = Checkpoints(tmp_path / "checkpoints", keep=None)
    monkeypatch.setattr(checkpoints._manager, "save",
                        lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError) as e:
        checkpoints.save(1, state(1.0), {"version": 1})
    assert not isinstance(e.value, Unrecoverable)
