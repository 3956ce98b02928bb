"""(c) Publishing a version: the learner's weights to N actor processes, and the floors.

The real path: `params_to_chunks` (safetensors layout, each array sent from its own
memory) in the learner, the learner's `WeightServer`, and N processes fetching the version's URL over HTTP as actors do
(`urllib`), all at once, as after every publish. Fetchers stream the body into one
reused buffer (actors keep the whole, `response.read()`; the wire and the server do the
same work, and 8 whole copies of a 1B model would not fit beside the learner here);
`params_from_bytes`, what an actor then does, is timed once in this process. The
scheduler carries only (version, URL): nothing here goes through Dask.

Floors, on the same machine: memcpy (NumPy copy of 1 GiB) and a loopback TCP stream (one
sender, one receiver, raw sockets, 1 MiB writes): what one copy into the kernel and out
again costs, the least any HTTP transfer over loopback can.

Models: random parameters of Llama-like shapes (`learner.model`, eval_shape only): 100M
(d_model 768, 10 layers, d_ff 3072, vocabulary 8192) and 1B (d_model 2048, 18 layers,
d_ff 5632, vocabulary 32000), float32 and bfloat16. Usage:

    python benchmarks/publish.py [--fetchers 8] [--models 100M,1B] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import threading
import time
import urllib.request

import numpy as np

from learner.serialization import params_from_bytes, params_to_chunks
from tasks.runtime.session.weight_server import WeightServer

MODELS = {
    "100M": dict(d_model=768, n_layers=10, n_heads=12, n_kv_heads=12, d_ff=3072, vocab=8192),
    "1B": dict(d_model=2048, n_layers=18, n_heads=16, n_kv_heads=16, d_ff=5632, vocab=32000),
}
CHUNK = 64 << 20  # a fetcher's reused buffer


def random_params(sizes: dict, dtype: str) -> dict:
    """The model's parameter tree (shapes from `learner.model`), filled with random values."""
    import jax
    import ml_dtypes

    from learner.config import ModelConfig, TokenizerConfig
    from learner.model import init_params

    config = ModelConfig(**sizes, max_len=64, tokenizer=TokenizerConfig(alphabet="ab"))
    shapes = jax.eval_shape(lambda: init_params(config, 0))
    rng = np.random.default_rng(0)
    cast = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    return jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32).astype(cast), shapes)


def fetch(url: str, start, done) -> None:
    """One actor process: waits for the publish, fetches the version, reports seconds and bytes."""
    buffer = memoryview(bytearray(CHUNK))
    done.put("ready")
    start.wait()
    began, total = time.perf_counter(), 0
    with urllib.request.urlopen(url, timeout=600) as response:
        while n := response.readinto(buffer):
            total += n
    done.put((time.perf_counter() - began, total))


def publish(params: dict, fetchers: int) -> dict:
    """Serialises and serves one version; `fetchers` processes fetch it at once."""
    began = time.perf_counter()
    chunks = params_to_chunks(params)
    serialize_s = time.perf_counter() - began
    size = sum(chunk.nbytes for chunk in chunks)
    server = WeightServer("127.0.0.1")
    server.serve(1, chunks)
    context = multiprocessing.get_context("spawn")
    start, done = context.Event(), context.Queue()
    processes = [context.Process(target=fetch, args=(server.url(1), start, done)) for _ in range(fetchers)]
    for process in processes:
        process.start()
    assert [done.get(timeout=300) for _ in processes] == ["ready"] * fetchers  # all started, waiting
    began = time.perf_counter()
    start.set()
    results = [done.get(timeout=900) for _ in processes]
    fetch_s = time.perf_counter() - began
    for process in processes:
        process.join()
    server.close()
    assert all(total == size for _, total in results)
    data = b"".join(chunks)  # what an actor holds once it has read the response
    began = time.perf_counter()
    params_from_bytes(data)
    parse_s = time.perf_counter() - began
    return {"bytes": size, "serialize_s": serialize_s, "fetch_s": fetch_s, "parse_s": parse_s,
            "slowest_fetcher_s": max(s for s, _ in results)}


def memcpy_gbps(size: int = 1 << 30) -> float:
    source, target = np.ones(size, np.uint8), np.empty(size, np.uint8)
    np.copyto(target, source)  # pages touched
    began = time.perf_counter()
    for _ in range(3):
        np.copyto(target, source)
    return 3 * size / (time.perf_counter() - began) / 1e9


def loopback_gbps(size: int = 1 << 30, write: int = 1 << 20) -> float:
    """One TCP stream over loopback: a sender thread, this thread receiving."""
    listener = socket.create_server(("127.0.0.1", 0))
    payload = b"\0" * write

    def send() -> None:
        with socket.create_connection(listener.getsockname()) as out:
            for _ in range(size // write):
                out.sendall(payload)

    sender = threading.Thread(target=send)
    sender.start()
    connection, _ = listener.accept()
    buffer, received = memoryview(bytearray(write)), 0
    began = time.perf_counter()
    while received < size:
        received += connection.recv_into(buffer)
    seconds = time.perf_counter() - began
    sender.join()
    connection.close()
    listener.close()
    return size / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetchers", type=int, default=8)
    parser.add_argument("--models", default="100M,1B")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    print(f"floors: memcpy {memcpy_gbps():.2f} GB/s, loopback TCP (one stream) {loopback_gbps():.2f} GB/s")
    print("model dtype       params  MB       serialize  fetch x N   GB/s (N x MB / fetch)  slowest  parse")
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            params = random_params(MODELS[name], dtype)
            count = sum(leaf.size for leaf in _leaves(params))
            r = publish(params, args.fetchers)
            del params
            print(f"{name:5} {dtype:9} {count / 1e6:7.0f}M {r['bytes'] / 1e6:7.0f}  {r['serialize_s']:8.2f}s "
                  f"{r['fetch_s']:8.2f}s   {args.fetchers * r['bytes'] / r['fetch_s'] / 1e9:8.2f}"
                  f"              {r['slowest_fetcher_s']:6.2f}s {r['parse_s']:6.2f}s", flush=True)


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


if __name__ == "__main__":
    main()
