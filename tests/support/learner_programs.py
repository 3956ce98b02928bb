"""Small programs in place of a learner's processes, for tests of where they run
(`tests/tasks/runtime/processes/test_learner_cluster.py`); importable in the processes those start."""

import os
import time
from pathlib import Path


def leader(directory: Path, events, stop) -> None:
    """Says hello, waits for the stop flag, and reports its result."""
    (directory / "leader.pid").write_text(str(os.getpid()))
    events.put(("log", ("info", "hello", False)))
    events.put(("progress", {"step": 1}))
    while not stop.is_set():
        time.sleep(0.05)
    events.put(("done", {"stopped": "interrupted"}))
    events.close()
    events.join_thread()


def follower(directory: Path, name: str) -> None:
    """Runs until killed, or until the file `name` appears."""
    (directory / "follower.pid").write_text(str(os.getpid()))
    while not (directory / name).exists():
        time.sleep(0.05)
