"""A Dask worker of its own, started as a command with resources, as on another machine."""

import contextlib
import os
import subprocess
import sys
from typing import Iterator

from distributed import Client


@contextlib.contextmanager
def tagged_worker(client: Client, resources: str, nthreads: int) -> Iterator[str]:
    """One more worker joining `client`'s cluster, started with `--resources RESOURCES`
    (e.g. "GPU=2") and importing what pytest imported; yields its address, stops it on exit."""
    before = set(client.scheduler_info(n_workers=-1)["workers"])
    process = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", client.scheduler.address,
                                "--nthreads", str(nthreads), "--resources", resources, "--no-dashboard"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        client.wait_for_workers(len(before) + 1, timeout=60)
        [address] = set(client.scheduler_info(n_workers=-1)["workers"]) - before
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)
