"""The learner's processes, one per host of `learner.hosts`, started on this machine
(`learner.cluster: local`).

Process 0 runs the session and reports to the task; the others follow it
(`tasks.runtime.session.lockstep`). They stand or fall together: once one has died the others
wait in a collective that never completes, so they are killed, the attempt fails, and
Prefect's retry starts all of them again from the latest checkpoint.

The task stops them at once with AT_ONCE, not SIGTERM: a Slurm job step sends SIGTERM to
every process of the step, and that one asks the leader for its next version, as a first
Ctrl-C does (`tasks.runtime.processes.interrupt`).
"""

from __future__ import annotations

import os
import signal
from multiprocessing.process import BaseProcess

from tasks.placement import free_port, process_environ

# The task's "stop at once" (a second Ctrl-C): the processes unwind and exit; one still
# starting, its handler not yet set, is ended by the signal's default action.
AT_ONCE = signal.SIGUSR2


def coordinator_environ(hosts: int) -> list[dict[str, str]]:
    """For each process, what `learner.multihost.initialize` reads; nothing for one host."""
    return process_environ(f"127.0.0.1:{free_port('127.0.0.1')}", hosts)  # process 0's coordination service


class LearnerProcesses:
    """Process 0 (the leader) and its followers, watched and stopped together."""

    def __init__(self, processes: list[BaseProcess]):
        self.leader, self.followers = processes[0], processes[1:]

    def start(self) -> None:
        for process in (self.leader, *self.followers):
            process.start()

    def _dead_follower(self) -> int | None:
        """The index of a follower that failed; one that exited cleanly has seen STOP."""
        return next((i for i, p in enumerate(self.followers, start=1) if p.exitcode not in (None, 0)), None)

    def failed(self) -> bool:
        return not self.leader.is_alive() or self._dead_follower() is not None

    def terminate(self) -> None:
        """Stops them at once (AT_ONCE)."""
        for process in (self.leader, *self.followers):
            if process.is_alive():
                os.kill(process.pid, AT_ONCE)

    def stop(self, grace_s: float) -> None:
        """Gives the leader `grace_s` to end (none once a follower died: it cannot), then
        kills whatever still runs; followers of a leader that ended cleanly are ending too."""
        self.leader.join(timeout=0 if self._dead_follower() is not None else grace_s)
        clean = self.leader.exitcode == 0
        for process in (self.leader, *self.followers):
            if clean:
                process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)

    def death(self) -> str:
        """Why the attempt failed: the first process that died."""
        follower = self._dead_follower()
        if follower is not None:
            return f"learner process {follower} died (exit code {self.followers[follower - 1].exitcode})"
        return f"learner process died (exit code {self.leader.exitcode})"
