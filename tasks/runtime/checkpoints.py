"""Checkpoints: one Orbax checkpoint per version, written atomically, the last `keep` kept.

Each holds the train state (params, optimizer state, step) and a JSON record of the
rest: version, RNG seed, the data cursor, the accounting, and the prompts that were in
flight or buffered (a resumed run generates exactly those again). One found damaged on
restore is moved aside, into `damaged-checkpoints/` beside the checkpoints' directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp


class Checkpoints:
    def __init__(self, directory: Path, keep: int | None):
        self.directory = directory.resolve()
        # Asynchronous: `save` returns once the state is copied to host memory and the
        # write goes on beside training; `wait` returns once it is committed on disk.
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                 enable_async_checkpointing=True))

    def path(self, version: int) -> Path:
        return self.directory / str(version)

    def latest_version(self) -> int | None:
        return self._manager.latest_step()

    def versions(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, version: int, state: Any, record: dict) -> Path:
        """Starts writing version `version` (after the previous write is committed); Orbax
        commits it by renaming a finished temporary directory."""
        self._manager.save(version, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record)))
        return self.path(version)

    def wait(self) -> None:
        """Returns once every started write is committed (raises if one failed)."""
        self._manager.wait_until_finished()

    def restore(self, version: int, abstract_state: Any) -> tuple[Any, dict]:
        """The state (placed as `abstract_state`'s shardings say) and record of `version`."""
        restored = self._manager.restore(version, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), record=ocp.args.JsonRestore()))
        return restored["state"], restored["record"]

    def set_aside(self, version: int) -> Path:
        """Moves version `version` out of the checkpoints (kept, to be looked at); returns
        where. The versions before it become the latest, and `version` can be written again."""
        aside = self.directory.parent / "damaged-checkpoints" / f"{version}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(exist_ok=True)
        self.path(version).rename(aside)
        self._manager.reload()
        return aside

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
