"""(f) What one Dask scheduler carries: the per-operation costs the scale model rests on.

A scheduler process (`dask scheduler`, no workers needed) and this process's clients, as
actor processes and the learner use it:
  1. `Variable.get`: every actor process polls the published version (weights: version and
     URL) every 50 ms (`tasks.actors.weights.POLL_S`);
  2. `Queue.put` + `Queue.get` of a 64 KiB bundle (`buffer.inline_bytes`): one flush of an
     actor process's finished groups, and the learner's take of it.
Each from 1, 4 and 16 client threads at once (threads of separate `Client`s: separate
connections, as separate processes have), for a few seconds: operations per second at
saturation, and the scheduler's CPU per operation (its process's CPU time / operations).
Usage:

    python benchmarks/scheduler_ops.py [--seconds 5] [--threads 1,4,16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import psutil
from distributed import Client, Queue, Variable

PAYLOAD = os.urandom(64 * 1024)


def start_scheduler() -> tuple[subprocess.Popen, str]:
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
                                  "--no-dashboard"], stderr=subprocess.PIPE, text=True)
    for line in scheduler.stderr:
        if "Scheduler at:" in line:
            return scheduler, line.split("Scheduler at:")[1].strip()
    raise RuntimeError("the scheduler did not start")


def poll(client: Client, stop: threading.Event, counts: list, i: int) -> None:
    variable = Variable("weights-version", client=client)
    while not stop.is_set():
        variable.get(timeout=30)
        counts[i] += 1


def put_take(client: Client, stop: threading.Event, counts: list, i: int) -> None:
    queue = Queue(f"buffer-{i}", client=client)
    while not stop.is_set():
        queue.put(PAYLOAD, timeout=30)
        queue.get(timeout=30)
        counts[i] += 1


def measure(address: str, scheduler: psutil.Process, operation, threads: int, seconds: float) -> tuple[float, float]:
    """(operations per second, scheduler CPU ms per operation)."""
    clients = [Client(address, set_as_default=False) for _ in range(threads)]
    Variable("weights-version", client=clients[0]).set({"version": 1, "url": "http://127.0.0.1:1/v/1"})
    stop, counts = threading.Event(), [0] * threads
    workers = [threading.Thread(target=operation, args=(c, stop, counts, i)) for i, c in enumerate(clients)]
    cpu = scheduler.cpu_times()
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    wall, used = time.perf_counter() - began, scheduler.cpu_times()
    for client in clients:
        client.close()
    operations = sum(counts)
    cpu_s = (used.user + used.system) - (cpu.user + cpu.system)
    return operations / wall, 1000 * cpu_s / operations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threads", default="1,4,16")
    args = parser.parse_args()
    scheduler, address = start_scheduler()
    try:
        process = psutil.Process(scheduler.pid)
        print("operation                      threads   ops/s   scheduler CPU ms/op")
        for name, operation in (("Variable.get (version poll)", poll), ("Queue put+get 64 KiB bundle", put_take)):
            for threads in map(int, args.threads.split(",")):
                rate, cpu_ms = measure(address, process, operation, threads, args.seconds)
                print(f"{name:30} {threads:7} {rate:8.0f}   {cpu_ms:8.3f}", flush=True)
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)


if __name__ == "__main__":
    main()
