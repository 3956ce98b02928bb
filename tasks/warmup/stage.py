"""The warm-up: supervised fine-tuning on demonstrations, before RL, resumable.

It trains the learner's model on its mesh with the learner's buckets, through the same
`TrainStep`, with the "supervised" objective (`learner.losses.supervised_loss`: the
agent's tokens only) and the warm-up's optimizer. Update k reads the demonstrations at
cursor positions [k * batch, (k + 1) * batch): demonstration order is a permutation of
all of them drawn anew each epoch from (seed, epoch), so the cursor alone says what was
read. Checkpoints (`warmup/checkpoints/K`, the train state and the cursor) every
`checkpoint_every` updates and at the last; a resumed warm-up restores the latest and
reads on from its cursor, its metrics cut back to it: no demonstration is lost or read
twice. The last checkpoint's weights are RL's version 0 (`warmed_params`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from learner.batching import make_batch
from learner.chat import make_tokenizer
from learner.config import FieldError, LearnerConfig, LossConfig, ModelConfig
from learner.sharding import make_mesh
from learner.train import TrainStep, abstract_train_state, init_train_state
from tasks.actors.envs import resolve_entrypoint
from tasks.config import EnvConfig, EvalConfig, WarmupConfig
from tasks.eval.prompts import held_out
from tasks.records.atomic import write_text_atomic
from tasks.records.metrics_log import MetricsLog
from tasks.run_dir import RunDir
from tasks.runtime.state.checkpoints import Checkpoints
from tasks.warmup.demonstrations import demonstrations, to_sample

KEEP = 2  # warm-up checkpoints kept: the latest, and the one before it should the latest be damaged


class WarmupSpec(Protocol):
    """The sections of the experiment spec (`flows.spec.Spec`) a warm-up reads."""

    seed: int
    env: EnvConfig
    model: ModelConfig
    learner: LearnerConfig
    eval: EvalConfig
    warmup: WarmupConfig | None

    @property
    def run_dir(self) -> Path: ...


def learner_config(spec: WarmupSpec) -> LearnerConfig:
    """The learner's settings for the warm-up: its optimizer, the supervised objective, one
    update a batch, no reference copy of the weights."""
    loss = LossConfig(objective="supervised", aggregation=spec.learner.loss.aggregation)
    return spec.learner.model_copy(update={"optimizer": spec.warmup.optimizer, "loss": loss, "minibatches": 1,
                                           "epochs": 1})


def order(cursor_start: int, n: int, count: int, seed: int) -> list[int]:
    """The demonstrations at cursor positions [cursor_start, cursor_start + count), out of `n`."""
    indices, epochs = [], {}
    for cursor in range(cursor_start, cursor_start + count):
        epoch, within = divmod(cursor, n)
        if epoch not in epochs:
            epochs[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
        indices.append(int(epochs[epoch][within]))
    return indices


def warm_up(spec: WarmupSpec, log: Callable[[str], None], interrupted: Callable[[], bool] = lambda: False) -> dict:
    """Runs the warm-up to `warmup.steps` updates from its latest checkpoint. Returns
    {"stopped": "steps" | "interrupted", "step", "checkpoint", "demonstrations", "nll"}."""
    config, run_dir = spec.warmup, RunDir(spec.run_dir.resolve())
    env_class = resolve_entrypoint(spec.env.entrypoint)
    demos = demonstrations(config, env_class, spec.env.kwargs, spec.seed,
                           held_out(spec.eval, env_class, spec.env.kwargs))
    tokenizer = make_tokenizer(spec.model)
    samples = [to_sample(d, tokenizer, spec.model.max_len, i) for i, d in enumerate(demos)]
    trained = learner_config(spec)
    mesh = make_mesh(spec.learner.mesh)
    step_fn = TrainStep(spec.model, trained, mesh)
    run_dir.warmup.mkdir(parents=True, exist_ok=True)
    checkpoints = Checkpoints(run_dir.warmup_checkpoints, KEEP)
    metrics = MetricsLog(run_dir.warmup_metrics, warn=log)
    try:
        step = checkpoints.latest_version() or 0
        if step:
            state, record = checkpoints.restore(step, abstract_train_state(spec.model, trained, mesh))
            if record["demonstrations"] != len(samples):
                raise ValueError(f"the warm-up's checkpoint {step} read {record['demonstrations']} demonstrations, "
                                 f"its source now holds {len(samples)}: resume with the same warmup.source")
            log(f"warm-up resumed from update {step} of {config.steps}")
        else:
            state = init_train_state(spec.model, trained, seed=spec.seed, mesh=mesh)
            log(f"warm-up: {config.steps} updates of {config.batch} of {len(samples)} demonstrations")
        metrics.resume(step, warn=log)
        nll, saved = None, step
        while step < config.steps and not interrupted():
            start = step * config.batch
            batch = warmup_batch([samples[i] for i in order(start, len(samples), config.batch, spec.seed)], spec)
            state, values = step_fn(state, batch)
            step, nll = step + 1, values["nll"]
            _append(run_dir.warmup_metrics, {"step": step, "time": time.time(), "cursor": [start, start + config.batch],
                                             "nll": nll, "grad_norm": values["grad_norm"], "tokens": values["tokens"],
                                             "padding": values["padding"]})
            if step % config.checkpoint_every == 0 or step == config.steps:
                _save(checkpoints, step, state, config, len(samples), nll)
                saved = step
            if step % 10 == 0 or step == config.steps:
                log(f"warm-up update {step}/{config.steps}: nll {nll:.4f}")
        if step > saved:  # interrupted between checkpoints: nothing read is lost
            _save(checkpoints, step, state, config, len(samples), nll)
        checkpoints.wait()
        if step >= config.steps:
            write_text_atomic(run_dir.warmup_finished, f"{step}\n")
    finally:
        checkpoints.close()
    return {"stopped": "steps" if step >= config.steps else "interrupted", "step": step,
            "checkpoint": str(checkpoints.path(step)), "demonstrations": len(samples), "nll": nll}


def warmup_batch(samples: list, spec: WarmupSpec):
    """One update's demonstrations packed into `warmup.rows` rows of the learner's buckets."""
    rows = spec.warmup.rows or spec.warmup.batch
    try:
        return make_batch(samples, [1.0] * len(samples), spec.learner.buckets, rows)
    except ValueError as e:
        raise FieldError("warmup.rows", f"{e}: raise warmup.rows (or learner.buckets), or lower warmup.batch") from None


def _save(checkpoints: Checkpoints, step: int, state: Any, config: WarmupConfig, n: int, nll: float) -> None:
    checkpoints.save(step, state, {"step": step, "cursor": step * config.batch, "demonstrations": n, "nll": nll})


def _append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def warmed_params(spec: WarmupSpec, mesh) -> Any:
    """The weights of the finished warm-up (its last checkpoint): RL's version 0."""
    run_dir = RunDir(spec.run_dir.resolve())
    if run_dir.warmed_up() is None:
        raise RuntimeError(f"the warm-up of {run_dir.path} has not finished (no {run_dir.warmup_finished})")
    checkpoints = Checkpoints(run_dir.warmup_checkpoints, KEEP)
    try:
        last = int(run_dir.warmed_up().name)
        state, _ = checkpoints.restore(last, abstract_train_state(spec.model, learner_config(spec), mesh))
        return state.params
    finally:
        checkpoints.close()
