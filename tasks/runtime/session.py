"""A learner session: the training loop of one attempt of the learner task.

Restore (or initialise) from the run directory, publish the weights, start the actors,
then take groups, train, and every `sync.interval` steps publish a new version,
checkpoint it and hand a record of it to the `reporter` (the learner task's Prefect side).
It runs in the learner's own process and touches no Prefect API itself.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Protocol

import numpy as np
from distributed import Client

from learner.batching import make_batch
from learner.config import LearnerConfig, ModelConfig
from learner.losses import group_advantages
from learner.sharding import make_mesh
from learner.train import TrainStep, abstract_train_state, init_train_state, params_numpy
from learner.trajectory import Group
from tasks.buffer.ledger import Ledger
from tasks.actors.actor import ActorSetup, run_actor
from tasks.buffer.channels import Channels, release_actors
from tasks.buffer.reader import BufferReader
from tasks.runtime.checkpoints import Checkpoints
from tasks.config import (ActorsConfig, BufferConfig, CheckpointConfig, DataConfig, EnvConfig,
                          SyncConfig)
from tasks.buffer.prompts import Prompt, PromptSource
from tasks.actors.envs import resolve_entrypoint
from tasks.buffer.intake import IntakeRules, Pace, outstanding_bound
from tasks.records.metrics_log import MetricsLog, write_json_atomic
from tasks.records.step import StepMeter
from tasks.runtime.weights import WeightPublisher
from tasks.records.tensorboard import TensorBoardLog


class RunSpec(Protocol):
    """The sections of the experiment spec the learner session reads."""

    name: str
    seed: int
    env: EnvConfig
    data: DataConfig
    model: ModelConfig
    actors: ActorsConfig
    buffer: BufferConfig
    learner: LearnerConfig
    sync: SyncConfig
    checkpoint: CheckpointConfig

    @property
    def run_dir(self) -> Path: ...


class Reporter(Protocol):
    """Where a session's records go: Prefect, through the learner task."""

    def version(self, **fields) -> None: ...  # a committed checkpoint: `tasks.records.record_version`
    def progress(self, step: int, version: int) -> None: ...  # after every step


class Session:
    """Args: `log` has .info/.warning; `reporter` receives versions and progress."""

    def __init__(self, spec: RunSpec, client: Client, channels: Channels, log, reporter: Reporter):
        self.spec, self.client, self.channels, self.log = spec, client, channels, log
        self.reporter = reporter
        self.run_dir = spec.run_dir.resolve()
        self.checkpoints = Checkpoints(self.run_dir / "checkpoints", spec.checkpoint.keep)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.ledger = Ledger()
        env_class = resolve_entrypoint(spec.env.entrypoint)
        self.source = PromptSource(spec.data, env_class, spec.env.kwargs, spec.seed)
        pace = Pace(batch_groups=spec.learner.batch_groups, sync_interval=spec.sync.interval,
                    updates_per_batch=spec.learner.updates_per_batch,
                    outstanding=outstanding_bound(spec.buffer.capacity, spec.actors.n_actors,
                                                  spec.learner.batch_groups),
                    synchronous=spec.learner.mode == "sync")
        self.rules = IntakeRules(spec.buffer, self.ledger, self.source, pace, spec.actors.n_actors,
                                 log=log.warning)
        self.mesh = make_mesh(spec.learner.mesh)
        self.train_step = TrainStep(spec.model, spec.learner, self.mesh)
        self.version_rows: list[dict] = []
        self._uncommitted: dict | None = None  # the record of a checkpoint still being written
        self._recent_success = collections.deque(maxlen=spec.learner.stop_window)  # per step

    def run(self) -> dict:
        state, version = self._restore_or_init()
        self.tensorboard = TensorBoardLog(self.run_dir / "tensorboard", resume_step=int(state.step))
        actors: list = []
        reader = self._reader(check=lambda: _raise_if_stopped(actors))
        reader.version = version
        # Admission control counts from the version the actors can use, so the reader's
        # version moves when a version has been sent, not when the learner hands it over.
        publisher = WeightPublisher(self.channels.weights, self.client,
                                    on_sent=lambda sent: setattr(reader, "version", sent))
        publisher.publish(version, params_numpy(state))
        actors += self._start_actors()
        try:
            state, version = self._train(state, version, reader, publisher)
            self._record_committed()
        finally:
            publisher.close()
            self._stop(actors, reader)
            accounting = self.rules.accounting()
            write_json_atomic(self.run_dir / "accounting.json", accounting)
            self.checkpoints.close()
            self.tensorboard.close()
        return {"step": int(state.step), "version": version, "accounting": accounting}

    def _restore_or_init(self):
        latest = self.checkpoints.latest_version()
        if latest is None:
            state = init_train_state(self.spec.model, self.spec.learner, seed=self.spec.seed, mesh=self.mesh)
            self.metrics.truncate_after(0)
            return state, 0
        abstract = abstract_train_state(self.spec.model, self.spec.learner, self.mesh)
        state, record = self.checkpoints.restore(latest, abstract)
        self.source.restore(record["data"])
        self.ledger.restore(record["accounting"])
        for prompt in record["redo"]:
            self.source.again(Prompt.from_wire(prompt))
        self.version_rows = record["versions"]
        self.metrics.truncate_after(record["step"])
        self.log.info(f"resumed from {self.checkpoints.path(latest)}: step {record['step']}, version {latest}")
        return state, latest

    def _reader(self, check) -> BufferReader:
        # Two batches ahead: the next batch's transfer overlaps the current step.
        return BufferReader(self.channels, self.client, self.rules, capacity=self.spec.buffer.capacity,
                            prefetch=2 * self.spec.learner.batch_groups, check=check).start()

    def _start_actors(self) -> list:
        spec = self.spec
        setup = ActorSetup(self.channels, spec.env, spec.actors, spec.buffer, spec.model, spec.seed)
        return [self.client.submit(run_actor, i, setup, pure=False,
                                   key=f"actor-{i}-{self.channels.session}")
                for i in range(spec.actors.n_actors)]

    def _stop(self, actors: list, reader: BufferReader, timeout_s: float = 120.0) -> None:
        """Stops the actors: no new groups, blocked puts released, queues closed."""
        reader.close()
        release_actors(self.client, self.channels, len(actors))
        deadline = time.monotonic() + timeout_s
        while any(not f.done() for f in actors) and time.monotonic() < deadline:
            reader.drain()
            time.sleep(0.05)
        for future in actors:
            if future.status == "finished":
                stats = future.result()
                self.log.info(f"actor {stats['actor']}: {stats['groups']} groups, rollout "
                              f"{stats['rollout_s']:.1f}s, buffer put {stats['queue_put_s']:.1f}s")
        self.client.cancel(actors)
        reader.release()

    def _train(self, state, version: int, reader: BufferReader, publisher: WeightPublisher):
        spec = self.spec
        step = int(state.step)
        meter = StepMeter(self.log)
        while step < spec.learner.steps:
            start = time.perf_counter()
            groups = reader.take(spec.learner.batch_groups, version)
            meter.took(time.perf_counter() - start)
            # One batch is `learner.minibatches × learner.epochs` steps (optimizer updates).
            updates = self.train_step.updates(state, self._batch(groups))
            start = time.perf_counter()
            for state, train_metrics in updates:
                step += 1
                record = meter.record(step, version, groups, train_metrics, time.perf_counter() - start,
                                      reader, self.train_step.compiles, self.ledger)
                self.metrics.append(record)
                self._recent_success.append(record.get("success_rate", 0.0))
                self.tensorboard.add(record)
                self.reporter.progress(step, version)
                if step % spec.sync.interval == 0:
                    version += 1
                    published = time.perf_counter()
                    publisher.publish(version, params_numpy(state))
                    if spec.learner.mode == "sync":  # the next batch is played with these weights
                        publisher.wait()
                    meter.published(time.perf_counter() - published, publisher.lag_s)
                    done = step >= spec.learner.steps or self._converged()
                    if version % spec.checkpoint.every == 0 or done:
                        self._checkpoint(state, step, version, record)
                    if done:
                        return state, version
                if step >= spec.learner.steps:
                    break
                start = time.perf_counter()
        return state, version

    def _converged(self) -> bool:
        """Whether `learner.stop_at_success` is reached (over the last `stop_window` steps)."""
        target, window = self.spec.learner.stop_at_success, self.spec.learner.stop_window
        if target is None:
            return False
        recent = self._recent_success
        if len(recent) == window and np.mean(recent) >= target:
            self.log.info(f"success {np.mean(recent):.1%} over the last {window} steps: stopping")
            return True
        return False

    def _batch(self, groups: list[Group]):
        rewards = np.stack([g.rewards for g in groups])
        advantages = np.asarray(group_advantages(rewards, normalize_std=self.spec.learner.loss.normalize_std))
        samples = [s for g in groups for s in g.samples]
        rows = self.spec.learner.batch_rows(len(samples))
        return make_batch(samples, advantages.reshape(-1).tolist(), self.spec.learner.buckets, rows)

    def _checkpoint(self, state, step: int, version: int, metrics: dict) -> None:
        """Starts writing the version's checkpoint; records the previous one, now committed."""
        self._record_committed()
        previous = self.checkpoints.latest_version()  # the parent: the last version checkpointed
        row = {"version": version, "step": step, "checkpoint": str(self.checkpoints.path(version)),
               "parent": previous,
               "reward_mean": metrics["reward_mean"], "time": metrics["time"]}
        self.version_rows.append(row)
        record = {"step": step, "version": version, "seed": self.spec.seed,
                  "data": self.source.state(), "accounting": self.ledger.state(),
                  "redo": [p.to_wire() for p in self.ledger.open_prompts()],
                  "versions": self.version_rows}
        path = self.checkpoints.save(version, state, record)
        write_json_atomic(self.run_dir / "accounting.json", self.rules.accounting())
        self._uncommitted = dict(
            run_name=self.spec.name, spec_path=self.run_dir / "spec.yaml", checkpoint=path,
            parent=self.checkpoints.path(previous) if previous is not None else None,
            version=version, step=step, metrics={"reward_mean": metrics["reward_mean"]},
            rows=list(self.version_rows))

    def _record_committed(self) -> None:
        """Waits for the checkpoint being written, then records it (Prefect sees only committed ones)."""
        self.checkpoints.wait()
        if self._uncommitted is not None:
            self.reporter.version(**self._uncommitted)
            self._uncommitted = None


def _raise_if_stopped(actors: list) -> None:
    """Surfaces an actor's failure to the learner instead of letting it wait forever."""
    for future in actors:
        if future.status == "error":
            error = future.exception()
            raise RuntimeError(f"actor {future.key} failed: {type(error).__name__}: {error}") from error
        if future.done():
            raise RuntimeError(f"actor {future.key} stopped before the learner finished")
