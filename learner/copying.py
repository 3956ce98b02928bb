"""Copy pretraining: a randomly initialised model learns to copy from its context.

A tool-using agent copies all the time: the numbers of the problem into the tool call,
the tool's result into the answer. Every pretrained language model arrives able to (its
induction heads: Olsson et al. 2022, "In-context Learning and Induction Heads"); a model
of random weights, the stand-in `tandem new-model` makes where no checkpoint can be
downloaded, does not. This teaches the generic skill: at qwen2's 25M shape, held-out spans
are copied 97% right after 600 updates. It is not yet what the word-problems warm-up
needs (which number to copy): there it did not measurably raise the copied digits' accuracy
(BENCHMARKS.md (o)).

Each update trains PER_ROW x ROWS spans of LENGTH random ordinary tokens, each shown
twice (bos, x, x), on the second showing only, through the learner's own `TrainStep` and
its supervised loss. Induction forms as a phase change: at 25M the loss stays near log(V)
for ~100 updates, then falls to 0.5-0.8 nats by ~600.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from learner.batching import make_batch
from learner.config import LearnerConfig, LossConfig, MeshConfig, ModelConfig, OptimizerConfig
from learner.model import Params, forward_fn
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state, params_numpy
from learner.trajectory import OBSERVATION, Sample

LENGTH = 24  # tokens a span, shown twice: 49 with bos
PER_ROW = 5  # spans packed in a row of 256
ROWS = 2  # rows an update, or one per device of the mesh if there are more
LR = 1e-3


def copy_sample(span: np.ndarray, bos: int) -> Sample:
    """bos, span, span: the second showing is the target (the policy's tokens, in a
    supervised batch), the first is context."""
    tokens = np.concatenate([[bos], span, span]).astype(np.int32)
    versions = np.concatenate([np.full(1 + len(span), OBSERVATION), np.zeros(len(span))]).astype(np.int32)
    return Sample(tokens=tokens, logprobs=np.zeros(len(tokens), np.float32), versions=versions, reward=1.0)


def copy_pretrain(params: Params, config: ModelConfig, *, ids: np.ndarray, bos: int, steps: int, seed: int = 0,
                  log: Callable[[str], None] = print) -> tuple[dict, dict]:
    """`steps` updates of copy pretraining from `params`, spans drawn from `ids` (the
    tokenizer's ordinary ids). Returns the trained parameters (host NumPy) and
    {"nll": the last update's, "copied": the share of held-out copies the model gets
    right (argmax, after the first token of the second showing)}."""
    mesh = make_mesh(MeshConfig())
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = -(-ROWS // shards) * shards
    learner = LearnerConfig(loss=LossConfig(objective="supervised"), optimizer=OptimizerConfig(lr=LR),
                            buckets=(256,), rows=rows)
    step_fn = TrainStep(config, learner, mesh)
    state = init_train_state(config, learner, seed=seed, mesh=mesh, params=params)
    rng = np.random.default_rng([seed, 1])
    nll = float("nan")
    for k in range(1, steps + 1):
        samples = [copy_sample(rng.choice(ids, LENGTH), bos) for _ in range(PER_ROW * rows)]
        state, values = step_fn(state, make_batch(samples, [1.0] * len(samples), learner.buckets, rows))
        nll = values["nll"]
        if k % 50 == 0 or k == steps:
            log(f"copy pretraining update {k}/{steps}: nll {nll:.3f}")
    params = params_numpy(state)
    return params, {"nll": nll, "copied": copied_share(params, config, ids=ids, bos=bos, seed=seed)}


def copied_share(params: Params, config: ModelConfig, *, ids: np.ndarray, bos: int, seed: int = 0,
                 spans: int = 16) -> float:
    """The share of tokens of a second showing, after its first, the model predicts right
    (argmax) on spans it never trained on."""
    rng = np.random.default_rng([seed, 2])
    tokens = np.stack([copy_sample(rng.choice(ids, LENGTH), bos).tokens for _ in range(spans)])
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    logits = jax.jit(forward_fn(config))(params, jnp.asarray(tokens), jnp.asarray(positions),
                                         jnp.ones_like(jnp.asarray(tokens)))
    predicted = np.asarray(jnp.argmax(logits, -1))[:, LENGTH + 1:-1]  # predicting tokens LENGTH+2 ..
    return float((predicted == tokens[:, LENGTH + 2:]).mean())
