"""(g) What a multi-host learner's lockstep costs per step: process 0's announcements and
the batch it broadcasts (`tasks.runtime.session.lockstep`), on this machine's loopback.

Runs itself as 2 processes × 2 CPU devices joined by `jax.distributed` (gloo), as
`learner.hosts: 2` does, and times on process 0: one announcement (a broadcast of 3
int32, the floor of any collective between the hosts) and one packed batch broadcast
(rows × 128 tokens, the 7 fields of `learner.batching.Batch`) with each host's rows cut out.
Usage:

    python benchmarks/lockstep.py [--rows 64] [--repeats 50]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def host(rows: int, repeats: int) -> None:
    import jax

    from learner import multihost
    from learner.batching import empty_batch
    from tasks.runtime.session import lockstep

    multihost.initialize(2)
    lead = jax.process_index() == 0
    batch = empty_batch(rows, 128)
    for name, step in (("announcement", lambda: lockstep.announce(lockstep.UPDATE) if lead else lockstep.receive()),
                       (f"batch {rows} x 128", lambda: lockstep.share_batch(batch, 1))):
        step()  # compiles
        began = time.perf_counter()
        for _ in range(repeats):
            step()
        if lead:
            nbytes = sum(a.nbytes for a in vars(batch).values()) if "batch" in name else 12
            print(f"{name:20} {1000 * (time.perf_counter() - began) / repeats:8.2f} ms  ({nbytes:,} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    from tasks.runtime.processes.hosts import coordinator_environ

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(REPO)}
    hosts = [subprocess.Popen([sys.executable, __file__, "--host", str(args.rows), str(args.repeats)],
                              env={**env, **environ}) for environ in coordinator_environ(2)]
    assert all(h.wait(timeout=600) == 0 for h in hosts)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--host"]:
        host(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
