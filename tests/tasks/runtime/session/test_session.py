"""The learner loop: real learner, weight source, buffer reader, run state and loggers, with
fakes only where Dask carries things between processes (the actors, the weights' transport)."""

import json
import threading

import jax
import pytest

from learner.config import LearnerConfig, MeshConfig
from learner.sharding import make_mesh
from learner.train import TrainStep, init_train_state
from tasks.buffer.ledger import balanced
from tasks.buffer.prompts import Prompt
from tasks.buffer.reader import BufferReader
from tasks.buffer.writer import outcomes
from tasks.records.loggers import Loggers
from tasks.records.metrics_log import MetricsLog
from tasks.records.step import StepMeter
from tasks.runtime.state.checkpoints import Checkpoints
from tasks.runtime.session.learner import Learner
from tasks.runtime.state.run_state import RunState
from tasks.runtime.session.session import Session
from tasks.runtime.session.no_signal import SignalWatch
from tasks.runtime.session.stopping import Stop, StopReason, StopRule, StopTraining
from tasks.runtime.session.weights import WeightSource
from tests.support.groups import TINY_MODEL, make_group, make_rules


class Transport:
    def __init__(self, fail_at=None):
        self.sent, self.fail_at = [], fail_at

    def send(self, version, params):
        if version == self.fail_at:
            raise ConnectionError("scheduler gone")
        self.sent.append(version)

    def close(self):
        pass


class InProcessActors:
    """The exchange and the actors' work in one fake: a thread that plays every prompt dispatched
    at once, with the version the actors can use, and hands the group to the reader."""

    def __init__(self, rules, reader, success=False, signal_prompts=None):
        self.rules, self.reader, self.success = rules, reader, success
        self.signal_prompts = signal_prompts  # prompts from this id on: every group filtered
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._play, daemon=True)

    def start(self):
        self.thread.start()

    def _play(self):
        while not self.stopping.is_set():
            version = self.reader.clock.visible
            for actor, prompts in self.rules.dispatch(version).items():
                for p in prompts:
                    if self.signal_prompts is not None and p.id >= self.signal_prompts:
                        self.rules.on_report({"event": "excluded", "actor": actor, "id": p.id, "attempt": p.attempt,
                                              "reason": "filtered", "detail": "rewards all 0.0"})
                        continue
                    group = make_group(p.id, (0.0, 1.0), version=version, attempt=p.attempt, success=self.success)
                    report = {"event": "buffered", "actor": actor, "id": p.id, "attempt": p.attempt, **outcomes(group)}
                    self.reader.stats.reported(report)
                    self.rules.on_report(report)
                    self.reader.arrive([group])
            self.reader.wake.wait(0.01)
            self.reader.wake.clear()

    def stop(self):
        self.stopping.set()
        self.thread.join(10)

    def release(self):
        pass

    def raise_if_failed(self):
        pass


class Actors:
    """The actors' pool: their work is done by `InProcessActors`, the exchange's stand-in."""

    def start(self):
        pass

    def stop(self):
        pass

    def raise_if_failed(self):
        pass


class Recorder:
    def __init__(self):
        self.versions, self.steps = [], []

    def version(self, **fields):
        self.versions.append(fields["version"])

    def write(self, record):
        self.steps.append((record.step, record.version))


def session(tmp_path, *, steps=8, interval=4, every=1, success=False, target=None, fail_at=None,
            signal_prompts=None, interrupted=lambda: False, **learner):
    config = LearnerConfig(steps=steps, batch_groups=2, buckets=(16,), stop_at_success=target, stop_window=4,
                           **learner)
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    learner = Learner(TrainStep(TINY_MODEL, config, mesh), init_train_state(TINY_MODEL, config, seed=0, mesh=mesh), config)
    rules = make_rules(outstanding=6)
    recorder = Recorder()
    run_state = RunState(Checkpoints(tmp_path / "checkpoints", keep=None), rules, recorder,
                         run_name="t", seed=0, run_dir=tmp_path, warn=print)
    weights = WeightSource(Transport(fail_at), interval)
    signal = SignalWatch(lambda: rules.ledger.snapshot()["excluded"], 2, config)

    def waiting():  # as `tasks.runtime.session.build` asks while the learner waits
        signal.raise_if_no_signal()
        if interrupted():
            raise StopTraining(Stop(StopReason.INTERRUPTED, "interrupted while waiting"))

    reader = BufferReader(rules, weights, prefetch=4, check=waiting)
    actors = InProcessActors(rules, reader, success, signal_prompts)
    loggers = Loggers(MetricsLog(tmp_path / "metrics.jsonl"), recorder)
    built = Session(learner=learner, weights=weights, reader=reader, exchange=actors, actors=Actors(),
                    run_state=run_state, meter=StepMeter(reader, rules.ledger, weights, learner), loggers=loggers,
                    stopping=StopRule(config), signal=signal, batch_groups=2, checkpoint_every=every,
                    synchronous=False, interrupted=interrupted)
    return built, recorder


def test_a_version_every_interval_steps_each_checkpointed_and_recorded(tmp_path):
    run, recorder = session(tmp_path, steps=8, interval=4)
    result = run.run()
    assert (result["step"], result["version"]) == (8, 2)
    assert recorder.steps == [(s, (s - 1) // 4) for s in range(1, 9)]  # "step 5, version 1"
    assert run.weights.current == 2 and Checkpoints(tmp_path / "checkpoints", None).versions() == [1, 2]
    assert recorder.versions == [1, 2]  # both committed by the end
    accounting = json.loads((tmp_path / "accounting.json").read_text())
    assert accounting["consumed"] == 16 and balanced(accounting)
    records = MetricsLog(tmp_path / "metrics.jsonl").read()
    assert [r["step"] for r in records] == list(range(1, 9))
    assert sorted(i for r in records for i in r["prompt_ids"]) == list(range(16))  # each prompt trained once
    assert not run.exchange.thread.is_alive()


def test_checkpoints_every_n_versions_and_at_the_end(tmp_path):
    run, recorder = session(tmp_path, steps=12, interval=2, every=4)
    run.run()
    assert Checkpoints(tmp_path / "checkpoints", None).versions() == [4, 6]
    assert recorder.versions == [4, 6]


def test_stops_at_the_success_target_on_a_version(tmp_path):
    run, recorder = session(tmp_path, steps=40, interval=2, success=True, target=0.4)
    result = run.run()
    # Success 50% from the first step; the window of 4 steps is full at step 4, a version.
    assert (result["step"], result["version"]) == (4, 2)
    assert recorder.versions == [1, 2]


def test_a_failed_publish_fails_the_session_and_stops_its_parts(tmp_path):
    run, _ = session(tmp_path, steps=12, interval=2, fail_at=2)
    with pytest.raises(RuntimeError, match="scheduler gone"):
        run.run()
    assert not run.exchange.thread.is_alive()
    assert balanced(json.loads((tmp_path / "accounting.json").read_text()))


def test_a_wait_without_signal_ends_on_a_checkpoint_and_puts_the_partial_batch_back(tmp_path):
    # Prompts 0-4 carry signal, then every group is filtered: the third batch holds prompt 4
    # alone when 2 batches' worth (4) of filtered groups have finished.
    run, recorder = session(tmp_path, steps=100, interval=1, every=100, signal_prompts=5, max_gen_batches=2,
                            no_signal_s=None)
    result = run.run()
    assert (result["stopped"], result["step"], result["version"]) == ("no-signal", 2, 2)
    assert result["message"].startswith("no learning signal: ") and "filtered" in result["message"]
    assert Checkpoints(tmp_path / "checkpoints", None).versions() == [2] and recorder.versions == [2]
    accounting = json.loads((tmp_path / "accounting.json").read_text())
    assert accounting["consumed"] == 4 and balanced(accounting)  # prompt 4 taken, put back: not consumed
    assert accounting["stopped"] == {"reason": "no-signal", "message": result["message"], "step": 2, "version": 2}
    records = [f.read_text() for f in (tmp_path / "checkpoints" / "2" / "record").iterdir() if f.is_file()]
    record = next(json.loads(text) for text in records if '"redo"' in text)
    assert 4 in [Prompt.from_wire(wire).id for wire in record["redo"]]  # a resumed run plays it again
    assert sorted(i for r in MetricsLog(tmp_path / "metrics.jsonl").read() for i in r["prompt_ids"]) == [0, 1, 2, 3]


def test_an_interrupt_while_the_learner_waits_acts_at_once(tmp_path):
    pressed = threading.Event()
    run, _ = session(tmp_path, steps=100, interval=4, every=100, signal_prompts=4, max_gen_batches=None,
                     no_signal_s=None, interrupted=pressed.is_set)
    threading.Timer(3.0, pressed.set).start()
    result = run.run()
    assert result["stopped"] == "interrupted"
    # Two steps trained, no version due (interval 4): they are published as version 1 and checkpointed.
    assert (result["step"], result["version"]) == (2, 1)
    assert Checkpoints(tmp_path / "checkpoints", None).versions() == [1]
    assert balanced(json.loads((tmp_path / "accounting.json").read_text()))
