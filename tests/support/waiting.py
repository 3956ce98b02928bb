"""Tests wait on a condition, never on a fixed sleep: a slow machine only waits longer."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(condition: Callable[[], object], what: str = "the condition", timeout_s: float = 60.0,
               poll_s: float = 0.01) -> None:
    """Returns once `condition()` is true; fails the test, naming `what`, after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(poll_s)
