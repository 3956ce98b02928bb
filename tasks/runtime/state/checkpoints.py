"""Checkpoints: one Orbax checkpoint per version, written atomically, the last `keep` kept.

Each holds the train state (params, optimizer state, step) and a JSON record of the
rest: version, RNG seed, the data cursor, the accounting, and the prompts that were in
flight or buffered (a resumed run generates exactly those again). One found damaged on
restore is moved aside, into `damaged-checkpoints/` beside the checkpoints' directory.
A write that runs out of disk space raises `DiskFull`, which no retry repeats.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import Any, Iterator

import jax
import orbax.checkpoint as ocp

from tasks.run_dir import committed_versions
from tasks.runtime.session.failures import DiskFull


class Checkpoints:
    def __init__(self, directory: Path, keep: int | None):
        self.directory = directory.resolve()
        # Asynchronous: `save` returns once the state is copied to host memory and the
        # write goes on beside training; `wait` returns once it is committed on disk.
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                 enable_async_checkpointing=True))
        self._writing: int | None = None  # the version written last

    def path(self, version: int) -> Path:
        return self.directory / str(version)

    def latest_version(self) -> int | None:
        return self._manager.latest_step()

    def versions(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, version: int, state: Any, record: dict) -> Path:
        """Starts writing version `version` (after the previous write is committed); Orbax
        commits it by renaming a finished temporary directory."""
        with self._disk_full_is_unrecoverable(version):
            self._manager.save(version, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record)))
        self._writing = version
        return self.path(version)

    def wait(self) -> None:
        """Returns once every started write is committed (raises if one failed)."""
        with self._disk_full_is_unrecoverable(self._writing):
            self._manager.wait_until_finished()

    @contextlib.contextmanager
    def _disk_full_is_unrecoverable(self, version: int | None) -> Iterator[None]:
        """Raises DiskFull for a write (of `version`, or the one before it, still being
        written) that ran out of space."""
        try:
            yield
        except Exception as e:
            if not _out_of_space(e):
                raise
            committed = self._committed()
            intact = f"the latest: version {max(committed)}" if committed else "there were none yet"
            writing = f"checkpoint {version}" if version is not None else "a checkpoint"
            raise DiskFull(f"writing {writing} in {self.directory}: the disk is full ({os.strerror(errno.ENOSPC)}); "
                           f"the previous checkpoints are intact ({intact}): free some space, then resume the run") from e

    def _committed(self) -> list[int]:
        """The versions on disk whole (Orbax's temporary directories are not versions)."""
        return committed_versions(self.directory)

    def mismatch(self, version: int, abstract_state: Any) -> list[str]:
        """How the arrays of `version` differ from `abstract_state`'s: one line per array
        missing on either side or of another shape; [] if they agree, or if its metadata
        does not read (then it is damaged, not of another spec)."""
        try:
            stored = ocp.StandardCheckpointHandler().metadata(self.path(version) / "state").tree
        except Exception:
            return []
        ours, theirs = _shapes(abstract_state), _shapes(stored)
        differ = {path: f"the checkpoint's shape {theirs[path]}, the spec's {shape}"
                  for path, shape in ours.items() if path in theirs and theirs[path] != shape}
        differ |= {path: "not in the checkpoint" for path in ours if path not in theirs}
        differ |= {path: "in the checkpoint, not in the spec's state" for path in theirs if path not in ours}
        # The outermost arrays first (the embedding before each layer's and the optimizer's).
        return [f"{path}: {why}" for path, why in sorted(differ.items(), key=lambda item: (item[0].count("."), item[0]))]

    def restore(self, version: int, abstract_state: Any) -> tuple[Any, dict]:
        """The state (placed as `abstract_state`'s shardings say) and record of `version`."""
        restored = self._manager.restore(version, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), record=ocp.args.JsonRestore()))
        return restored["state"], restored["record"]

    def record(self, version: int) -> dict:
        """The JSON record of `version` alone (its step, data cursor, accounting), arrays unread."""
        return self._manager.restore(version, args=ocp.args.Composite(record=ocp.args.JsonRestore()))["record"]

    def set_aside(self, version: int) -> Path:
        """Moves version `version` out of the checkpoints (kept, to be looked at); returns
        where. The versions before it become the latest, and `version` can be written again."""
        aside = self.directory.parent / "damaged-checkpoints" / f"{version}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(exist_ok=True)
        self.path(version).rename(aside)
        self._manager.reload()
        return aside

    def close(self) -> None:
        self.wait()
        self._manager.close()


def _out_of_space(error: BaseException | None) -> bool:
    """Whether `error`, or one it was raised from, is ENOSPC: an OSError, or TensorStore's
    ValueError (`RESOURCE_EXHAUSTED: ... [os_error_code='28']`) from Orbax's array writes."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if f"os_error_code='{errno.ENOSPC}'" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Each array of `tree` by its path ("params.embed.embedding"), as Orbax names it on
    disk: a NamedTuple's fields and a dict's keys by name, a sequence's items by index."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_name(key) for key in path): tuple(leaf.shape) for path, leaf in leaves}


def _key_name(key: Any) -> str:
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    return str(key)
