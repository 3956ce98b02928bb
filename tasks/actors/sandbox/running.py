"""Running code in the sandbox: `run` waits in the calling thread, `run_async` on the event
loop. Both kill the run at its wall time or when the caller gives up on it (an exception,
a cancellation), and return only once all of it is gone."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import time

from tasks.actors.sandbox.launch import Launch
from tasks.actors.sandbox.limits import Limits
from tasks.actors.sandbox.result import Result


def run(code: str, limits: Limits = Limits()) -> Result:
    """Runs `code` as a Python script in the sandbox and waits for it (and all it started)."""
    with Launch(code, limits) as launch:
        proc = subprocess.Popen(**launch.popen_args())
        try:
            deadline = time.monotonic() + limits.wall_s
            launch.started()
            launch.join_cgroup(proc.pid)
            timed_out = not _exits_within(proc, max(0.0, deadline - time.monotonic()))
            if timed_out:
                launch.kill(proc.pid)
            exit = proc.wait()
        except BaseException:  # KeyboardInterrupt, say: the run must not outlive us
            launch.abort(proc.pid)
            raise
        launch.wait_gone(exit)
        return launch.result(exit, timed_out)


async def run_async(code: str, limits: Limits = Limits()) -> Result:
    """`run` for event loops: waits for the code without holding a thread."""
    loop = asyncio.get_running_loop()
    with Launch(code, limits) as launch:
        args = launch.popen_args()
        proc = await asyncio.create_subprocess_exec(*args.pop("args"), **args)
        try:
            deadline = loop.time() + limits.wall_s
            launch.started()
            if launch.cgroup:  # a blocking write of ~10 ms (an RCU grace period), off the loop
                await loop.run_in_executor(None, launch.join_cgroup, proc.pid)
            try:
                await asyncio.wait_for(proc.wait(), max(0.0, deadline - loop.time()))
                timed_out = False
            except asyncio.TimeoutError:
                timed_out = True
                launch.kill(proc.pid)
            exit = await proc.wait()
        except BaseException:  # cancelled, say: the run must not outlive the step
            launch.abort(proc.pid)
            raise
        pidfd = launch.init_pidfd(exit)
        if pidfd is not None:  # the init (and so the namespace) may still be going away
            try:
                await _readable(pidfd, timeout=5)
            finally:
                launch.reap(pidfd)
        return launch.result(exit, timed_out)


def _exits_within(proc: subprocess.Popen, timeout: float) -> bool:
    """`proc.wait(timeout)`, but woken by the exit itself (a pidfd), not by polling: the
    subprocess module polls with sleeps of up to 50 ms, most of a short run's cost."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # Linux < 5.3
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


async def _readable(fd: int, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await asyncio.wait_for(ready, timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        loop.remove_reader(fd)
