"""Builds a learner session's parts from the spec, restoring the run directory's latest
checkpoint if it has one: the one place that knows which part needs which section."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from distributed import Client

from learner.chat import make_tokenizer
from learner.config import LearnerConfig, ModelConfig
from learner.sharding import make_mesh
from learner.train import TrainStep, abstract_train_state, init_train_state
from tasks.actors.actor import ActorSetup
from tasks.actors.envs import resolve_entrypoint
from tasks.actors.pool import ActorPool
from tasks.buffer.channels import Channels
from tasks.buffer.exchange import Exchange
from tasks.buffer.intake import Exclusion, IntakeRules, Pace, outstanding_bound
from tasks.buffer.ledger import Ledger
from tasks.buffer.prompts import PromptSource
from tasks.buffer.reader import BufferReader
from tasks.config import (ActorsConfig, BufferConfig, CheckpointConfig, DataConfig, EnvConfig, EpisodesConfig,
                          EvalConfig, SyncConfig, WarmupConfig)
from tasks.eval.prompts import held_out
from tasks.records.episodes import EpisodeSample
from tasks.records.loggers import ConsoleLog, Loggers, Progress, ProgressLog
from tasks.records.metrics_log import MetricsLog
from tasks.records.step import StepMeter
from tasks.records.tensorboard import TensorBoardLog
from tasks.run_dir import RunDir
from tasks.runtime.state.checkpoints import Checkpoints
from tasks.runtime.session.learner import Learner
from tasks.runtime.session.lockstep import RESTORED, LeadCheckpoints, LeadLearner, announce, restore_latest
from tasks.runtime.session.no_progress import ProgressWatch
from tasks.runtime.state.run_state import RunState
from tasks.runtime.session.session import Session
from tasks.runtime.session.no_signal import SignalWatch
from tasks.runtime.session.stopping import Stop, StopReason, StopRule, StopTraining
from tasks.runtime.session.weights import HttpTransport, WeightSource
from tasks.warmup.stage import warmed_params


class RunSpec(Protocol):
    """The sections of the experiment spec (`flows.spec.Spec`) a session reads."""

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
    eval: EvalConfig
    episodes: EpisodesConfig
    warmup: WarmupConfig | None

    @property
    def run_dir(self) -> Path: ...


class Reporter(Protocol):
    """Where a session's records go: Prefect, through the learner task."""

    def version(self, **fields) -> None: ...  # a committed checkpoint (`tasks.records.artifacts.record_version`)
    def progress(self, progress: Progress) -> None: ...  # after every step
    def evaluate(self, **fields) -> None: ...  # a version to evaluate (`Session.evaluate`)


def intake_rules(spec: RunSpec, log, ledger: Ledger | None = None,
                 observers: Sequence[Callable[[Exclusion], None]] = ()) -> IntakeRules:
    """The buffer's rules, drawing prompts from the spec's data source; `observers` are
    told each exclusion at the buffer's entry."""
    env_class = resolve_entrypoint(spec.env.entrypoint)
    source = PromptSource(spec.data, env_class, spec.env.kwargs, spec.seed,
                          held_out=held_out(spec.eval, env_class, spec.env.kwargs))
    pace = Pace(batch_groups=spec.learner.batch_groups, sync_interval=spec.sync.interval,
                updates_per_batch=spec.learner.updates_per_batch, synchronous=spec.learner.mode == "sync",
                outstanding=outstanding_bound(spec.buffer.capacity, spec.actors.groups_at_once, spec.learner.batch_groups))
    return IntakeRules(spec.buffer, ledger or Ledger(), source, pace, spec.actors.workers, log=log,
                       observers=observers)


def _train_state(spec: RunSpec, run_state: RunState, mesh, log) -> tuple[Any, int, int]:
    """(state, step, version): the latest checkpoint's, or a new run's (its weights the
    warm-up's, if the spec has one: `tasks.warmup`)."""
    restored = run_state.restore(abstract_train_state(spec.model, spec.learner, mesh))
    if spec.learner.hosts > 1:  # the other processes restore the same version (`tasks.runtime.session.lockstep`)
        announce(RESTORED, -1 if restored is None else restored.version)
    if restored is None:
        params = warmed_params(spec, mesh) if spec.warmup else None
        return init_train_state(spec.model, spec.learner, seed=spec.seed, mesh=mesh, params=params), 0, 0
    log.info(f"resumed from {restored.path}: step {restored.step}, version {restored.version}")
    return restored.state, restored.step, restored.version


def _episodes(spec: RunSpec, run_dir: Path) -> Callable[[list], None]:
    """Keeps a few episodes of each version as text (`episodes.per_version`)."""
    if not spec.episodes.per_version:
        return lambda groups: None
    return EpisodeSample(RunDir(run_dir).episodes, make_tokenizer(spec.model), spec.episodes.per_version,
                         int(spec.episodes.max_mb * 2**20)).add


def _loggers(run_dir: Path, step: int, log, reporter: Reporter) -> Loggers:
    """Where each step's record goes; `metrics.jsonl` cut back to `step` on a resume."""
    metrics = MetricsLog(RunDir(run_dir).metrics)
    metrics.resume(step, warn=log.warning)
    return Loggers(metrics, TensorBoardLog(RunDir(run_dir).tensorboard, resume_step=step), ConsoleLog(log.routine),
                   ProgressLog(reporter.progress))


def _evaluate(spec: RunSpec, reporter: Reporter) -> Callable[..., None]:
    """Hands the versions `eval.every` names, and the last, to the learner task."""

    def evaluate(*, last: bool, **version) -> None:
        if spec.eval.every is not None and (last or spec.eval.due(version["version"])):
            reporter.evaluate(**version)

    return evaluate


def build_session(spec: RunSpec, client: Client, channels: Channels, log, reporter: Reporter,
                  interrupted: Callable[[], bool] = lambda: False) -> Session:
    """The parts of a session of `spec`; `log` has .info and .warning; once `interrupted()`,
    the session ends at its next version (Ctrl-C)."""
    run_dir = spec.run_dir.resolve()
    ledger = Ledger()
    watch = ProgressWatch(lambda: ledger.consumed, spec.env.entrypoint)
    signal = SignalWatch(lambda: ledger.snapshot()["excluded"], spec.learner.batch_groups, spec.learner)
    rules = intake_rules(spec, log.warning, ledger, observers=(watch.excluded, signal.excluded))
    several = spec.learner.hosts > 1  # this is process 0, which the others follow (`lockstep`)
    checkpoints = (LeadCheckpoints if several else Checkpoints)(RunDir(run_dir).checkpoints, spec.checkpoint.keep)
    origin = RunDir(run_dir).warmed_up() if spec.warmup else None
    run_state = RunState(checkpoints, rules, reporter, run_name=spec.name, seed=spec.seed, run_dir=run_dir,
                         warn=log.warning, origin=origin)
    mesh = make_mesh(spec.learner.mesh)
    state, step, version = _train_state(spec, run_state, mesh, log)
    learner = (LeadLearner if several else Learner)(TrainStep(spec.model, spec.learner, mesh), state, spec.learner)
    weights = WeightSource(HttpTransport(channels, client), spec.sync.interval, version=version)
    setup = ActorSetup(channels, spec.env, spec.actors, spec.buffer, spec.model, spec.seed)
    actors = ActorPool(client, setup, spec.actors.workers, log.info, warn=log.warning, resources=spec.actors.resources)

    def waiting() -> None:  # a starved learner asks every 0.5 s; raises instead of waiting forever
        exchange.raise_if_failed()
        actors.raise_if_failed()
        watch.raise_if_stuck()
        signal.raise_if_no_signal()
        if interrupted():
            raise StopTraining(Stop(StopReason.INTERRUPTED, "interrupted while the learner waited for groups"))

    # Two batches ahead: the next batch's transfer overlaps the current step.
    # The learner holds up to `buffer.capacity` groups (at least a batch, ready when a step
    # ends); beyond them each actor process has one bundle of finished groups waiting in
    # the Dask queue, and blocks on the next (backpressure).
    reader = BufferReader(rules, weights, prefetch=max(spec.buffer.capacity, spec.learner.batch_groups),
                          check=waiting)
    exchange = Exchange(channels, client, rules, reader, capacity=spec.actors.workers)
    loggers = _loggers(run_dir, step, log, reporter)
    return Session(learner=learner, weights=weights, reader=reader, exchange=exchange, actors=actors,
                   run_state=run_state, meter=StepMeter(reader, rules.ledger, weights, learner), loggers=loggers,
                   stopping=StopRule(spec.learner), signal=signal, batch_groups=spec.learner.batch_groups,
                   checkpoint_every=spec.checkpoint.every, synchronous=spec.learner.mode == "sync",
                   interrupted=interrupted, episodes=_episodes(spec, run_dir),
                   evaluate=_evaluate(spec, reporter))


def build_follower(spec: RunSpec) -> tuple[Learner, Checkpoints]:
    """The learner and checkpoints of a process other than 0 of a multi-host learner:
    its shards of the train state, restored from the checkpoint process 0 restores."""
    checkpoints = Checkpoints(RunDir(spec.run_dir.resolve()).checkpoints, spec.checkpoint.keep)
    mesh = make_mesh(spec.learner.mesh)
    state, version = restore_latest(checkpoints, abstract_train_state(spec.model, spec.learner, mesh))
    if version is None:
        state = init_train_state(spec.model, spec.learner, seed=spec.seed, mesh=mesh)
    return Learner(TrainStep(spec.model, spec.learner, mesh), state, spec.learner), checkpoints
