"""(b) The buffer: put->take latency and throughput, and what it costs the learner per step.

1. Transport. Producers on Dask workers put payloads the two ways actors put groups:
   inline (pickled into the `distributed.Queue.put`, through the scheduler) and as a
   future (`scatter` to their own worker, then a put of the future); one consumer in this
   process takes them (`get`, then unpickling or `future.result()`). Latency is put
   (before the pickling or scatter) to taken (data in hand), over payloads of 1 KB-1 MB
   (random bytes: nothing compresses) and 1-16 producers. The floor: the same with threads
   and an in-process `queue.Queue`, which copies nothing.
2. Learner overhead. A real `BufferReader` (prefetch thread, reports, dispatch) fed by
   canned actors (real `BufferWriter`s putting a fixed group as fast as prompts come),
   and the default spec's `TrainStep`: the time `take` costs a step when the buffer is
   not empty, and how much the exchange thread slows the step itself, against the same
   steps with the reader closed; with all the learner's threads on one core (a host
   without an accelerator), and with XLA's threads on a core apart from Python's (as
   with an accelerator).

As on separate hardware, the producers and the Dask scheduler (`dask scheduler` and
`dask worker` processes) run on some cores, and this process, the consumer (the
learner's host), on the others. Usage:

    python benchmarks/buffer_latency.py [--quick] [--items 200] [--part transport|learner] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import pickle
import queue
import sys
import threading
import time
import uuid
from pathlib import Path

import cloudpickle
import numpy as np
import psutil
from distributed import Client, Queue, get_client, get_worker

from harness import actor_pool, emit, pin_threads, split_cores

SIZES = (1_000, 10_000, 100_000, 1_000_000)
PRODUCERS = (1, 4, 16)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this script


def dask_producer(name: str, size: int, n: int, inline: bool) -> None:
    client, here = get_client(), get_worker().address
    channel, data = Queue(name, client=client), np.frombuffer(os.urandom(size), np.uint8)
    for _ in range(n):
        if inline:
            channel.put(pickle.dumps((time.time(), data), protocol=pickle.HIGHEST_PROTOCOL))
        else:
            [future] = client.scatter([(time.time(), data)], workers=[here], hash=False)
            channel.put(future)


def dask_cell(client: Client, size: int, producers: int, items: int, inline: bool) -> list[float]:
    """put->take seconds of `items` payloads from `producers` Dask tasks."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    channel = Queue(name, client=client, maxsize=32)
    tasks = [client.submit(dask_producer, name, size, items // producers, inline, pure=False)
             for _ in range(producers)]
    latencies = []
    for _ in range(items // producers * producers):
        item = channel.get()
        sent, _ = pickle.loads(item) if inline else item.result()
        latencies.append(time.time() - sent)
    client.gather(tasks)
    channel.close()
    return latencies


def thread_cell(size: int, producers: int, items: int) -> list[float]:
    """The floor: the same through `queue.Queue` between threads of this process."""
    channel, data = queue.Queue(maxsize=32), np.frombuffer(os.urandom(size), np.uint8)

    def produce(n: int) -> None:
        for _ in range(n):
            channel.put((time.time(), data))

    threads = [threading.Thread(target=produce, args=(items // producers,)) for _ in range(producers)]
    for t in threads:
        t.start()
    latencies = []
    for _ in range(items // producers * producers):
        sent, _ = channel.get()
        latencies.append(time.time() - sent)
    for t in threads:
        t.join()
    return latencies


def transport(client: Client, items: int) -> list[dict]:
    rows = []
    for size in SIZES:
        for producers in PRODUCERS:
            for kind, run in (("queue.Queue", lambda: thread_cell(size, producers, items)),
                              ("dask inline", lambda: dask_cell(client, size, producers, items, True)),
                              ("dask future", lambda: dask_cell(client, size, producers, items, False))):
                start = time.perf_counter()
                latencies = run()
                elapsed = time.perf_counter() - start
                rows.append({"payload_kb": size / 1000, "producers": producers, "buffer": kind,
                             "p50_ms": 1e3 * float(np.median(latencies)),
                             "p99_ms": 1e3 * float(np.percentile(latencies, 99)),
                             "items/s": len(latencies) / elapsed, "MB/s": len(latencies) * size / elapsed / 1e6})
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="48 items a cell, 8 learner steps")
    parser.add_argument("--items", type=int, default=320, help="payloads per cell")
    parser.add_argument("--steps", type=int, default=30, help="learner steps timed, each way")
    parser.add_argument("--part", choices=("transport", "learner"), help="only this part")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "buffer.json")
    args = parser.parse_args()
    if args.quick:
        args.items, args.steps = 48, 8
    from learner_overhead import learner_overhead  # imports JAX; the transport part does not need it

    # As on separate hardware: producers and the scheduler on some cores, this process
    # (the consumer: the learner's host) on the others.
    learner_cores, actor_cores = split_cores()
    with actor_pool(actor_cores, workers=2, threads=8) as address, Client(address) as client:
        pin_threads(psutil.Process(), learner_cores)
        rows = transport(client, args.items) if args.part != "learner" else []
        overhead = learner_overhead(client, args.steps, learner_cores, actor_cores) if args.part != "transport" else []
    if rows:
        emit("buffer transport: put->take latency and throughput", rows, args.out.with_name("buffer_transport.json"))
    if overhead:
        emit("buffer cost to the learner per step (buffer not empty)", overhead, args.out,
             transport=rows, args=vars(args) | {"out": str(args.out)})


if __name__ == "__main__":
    main()
