"""What a run gives back: a `Result`, with the limit that ended it; or, where the code
cannot be isolated, `SandboxUnavailable`, and nothing ran."""

from __future__ import annotations

import dataclasses
import signal


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate the code (no namespaces); nothing was run."""


@dataclasses.dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit: int  # the exit status; -N when a signal N ended the process
    timed_out: bool  # killed at the wall-time limit
    killed_reason: str | None  # the limit that ended the run: cpu, memory, processes, output or wall

    @property
    def ok(self) -> bool:
        return self.exit == 0 and self.killed_reason is None


def killed_reason(exit: int, timed_out: bool, init_reason: str | None, events: dict, stderr: str,
                  output_full: bool, cgroups: bool) -> str | None:
    """The limit that ended the run, if one did: the caller's wall clock, then the init's
    own verdict (the tree's CPU time or memory), then the cgroup's counters, then what
    the code's end shows (its signal, a full output, its error)."""
    if timed_out:
        return "wall"
    if init_reason is not None:
        return init_reason
    if events.get("oom_kill"):
        return "memory"  # the cgroup's OOM killer killed one of the run's processes
    if events.get("forks_refused") and exit != 0:
        return "processes"  # a fork was refused at pids.max, and the run failed
    if exit == -signal.SIGXCPU or exit == -signal.SIGKILL:
        return "cpu"  # SIGKILL: the hard CPU limit, a second after an ignored SIGXCPU
    if output_full:
        return "output"
    if exit != 0 and "MemoryError" in stderr:
        return "memory"
    if exit != 0 and not cgroups and "BlockingIOError" in stderr:
        return "processes"  # RLIMIT_NPROC: no counter says so, the code's error does
    return None
