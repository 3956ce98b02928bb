"""The run state: what a checkpoint holds, saved and restored alone (real Orbax checkpoints,
real intake rules), and one consistent snapshot of the intake however its thread interleaves."""

import threading

import jax
import numpy as np
import pytest

from learner.config import LearnerConfig, LossConfig, MeshConfig, ModelConfig
from learner.sharding import make_mesh
from learner.train import abstract_train_state, init_train_state
from tasks.buffer.ledger import balanced
from tasks.runtime.state.checkpoints import Checkpoints
from tasks.runtime.session.failures import Unrecoverable
from tasks.run_dir import RunDir
from tasks.runtime.state.run_state import RunState
from tests.support.groups import make_group, make_rules


class Recorder:
    def __init__(self):
        self.versions = []

    def version(self, **fields):
        self.versions.append(fields)


def train_state(value: float):
    return {"w": np.full(3, value, np.float32), "step": np.int32(value)}


ABSTRACT = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), train_state(0.0))


def run_state(tmp_path, rules, recorder=None, warnings=None):
    warn = warnings.append if warnings is not None else print
    return RunState(Checkpoints(tmp_path / "checkpoints", keep=None), rules, recorder or Recorder(),
                    run_name="t", seed=7, run_dir=tmp_path, warn=warn)


def test_nothing_to_restore_in_a_new_run_directory(tmp_path):
    assert run_state(tmp_path, make_rules()).restore(ABSTRACT) is None


def test_a_restored_run_redoes_what_was_open_and_keeps_what_was_closed(tmp_path):
    rules = make_rules(n_actors=2)
    rules.dispatch(version=0)  # 100 prompts out (the outstanding bound)
    rules.on_report({"event": "buffered", "actor": 0, "id": 0, "attempt": 0})
    assert rules.on_take(make_group(0), version=1) == 1
    rules.on_report({"event": "excluded", "actor": 1, "id": 1, "attempt": 0, "reason": "filtered", "detail": ""})
    saved = run_state(tmp_path, rules)
    saved.save(train_state(4.0), step=4, version=1, reward_mean=0.5)
    saved.close()

    fresh = make_rules(n_actors=2)
    restored = run_state(tmp_path, fresh).restore(ABSTRACT)
    assert (restored.step, restored.version) == (4, 1)
    assert restored.state["w"].tolist() == [4.0] * 3
    accounting = fresh.accounting()
    assert (accounting["consumed"], accounting["excluded"]) == (1, {"filtered": 1})
    assert balanced(accounting)
    # The 98 open attempts are drawn again before any new prompt, in their order.
    redone = [fresh.source.next().id for _ in range(98)]
    assert redone == list(range(2, 100)) and fresh.source.next().id == 100


def test_a_version_is_recorded_only_once_its_checkpoint_is_committed(tmp_path):
    recorder = Recorder()
    state = run_state(tmp_path, make_rules(), recorder)
    state.save(train_state(1.0), step=4, version=1, reward_mean=0.25)
    assert recorder.versions == []  # being written
    state.save(train_state(2.0), step=8, version=2, reward_mean=0.5)
    assert [v["version"] for v in recorder.versions] == [1]
    state.commit()
    assert [(v["version"], v["parent"]) for v in recorder.versions] == [(1, None), (2, tmp_path.resolve() / "checkpoints" / "1")]
    state.close()


def test_each_version_event_carries_its_own_row_and_the_run_dir_the_whole_table(tmp_path):
    """The table lives in the checkpoints' records; an event carrying the whole of it would
    grow with the run until it outgrew the pipe, where a learner killed mid-message hung the task."""
    recorder = Recorder()
    state = run_state(tmp_path, make_rules(), recorder)
    for version in (1, 2, 3):
        state.save(train_state(version), step=4 * version, version=version, reward_mean=0.5)
    state.commit()
    state.close()
    assert [v["row"]["version"] for v in recorder.versions] == [1, 2, 3]
    assert [row["step"] for row in RunDir(tmp_path).versions_table()] == [4, 8, 12]

    resumed_recorder = Recorder()  # a new session: its task reads the table from the run directory
    resumed = run_state(tmp_path, make_rules(), resumed_recorder)
    resumed.restore(ABSTRACT)
    for version in (4, 5):
        resumed.save(train_state(version), step=4 * version, version=version, reward_mean=0.5)
    resumed.commit()
    resumed.close()
    assert [v["row"]["version"] for v in resumed_recorder.versions] == [4, 5]
    assert [(row["version"], row["parent"]) for row in RunDir(tmp_path).versions_table()] == [
        (1, None), (2, 1), (3, 2), (4, 3), (5, 4)]


def test_the_intake_snapshot_is_consistent_while_the_exchange_thread_works(tmp_path):
    """The exchange thread dispatches, excludes (retrying) and consumes while checkpoints are
    taken: every snapshot must be one moment's, so that a run resumed from it draws no
    prompt twice and loses none (a dispatch between reading the cursor and the open
    prompts would list a prompt both to redo and to draw anew)."""
    rules = make_rules(n_actors=4, outstanding=8, retry=("aborted",), max_retries=1000)
    stop = threading.Event()

    def intake():
        turn = 0
        while not stop.is_set():
            for actor, prompts in rules.dispatch(version=0).items():
                for prompt in prompts:
                    turn += 1
                    if turn % 3:
                        rules.on_report({"event": "excluded", "actor": actor, "id": prompt.id,
                                         "attempt": prompt.attempt, "reason": "aborted", "detail": ""})
                    else:
                        rules.on_report({"event": "buffered", "actor": actor, "id": prompt.id, "attempt": prompt.attempt})
                        rules.on_take(make_group(prompt.id, attempt=prompt.attempt), version=0)

    thread = threading.Thread(target=intake)
    thread.start()
    try:
        for _ in range(3000):
            snapshot = rules.snapshot()
            cursor = snapshot["data"]["cursor"]
            waiting = [p[0] for p in snapshot["data"]["again"]]
            redo = [p[0] for p in snapshot["redo"]]
            to_draw = redo + waiting
            assert all(i < cursor for i in to_draw), "a prompt to redo would also be drawn anew"
            assert len(set(to_draw)) == len(to_draw), "a prompt listed twice"
            # No exclusion here is final, so every prompt drawn is consumed or to be drawn again.
            assert cursor == snapshot["accounting"]["consumed"] + len(to_draw), "a prompt lost"
    finally:
        stop.set()
        thread.join()


def test_a_dispatch_waits_for_a_snapshot_in_progress():
    """The deterministic interleaving behind the stress test: a dispatch arriving while the
    snapshot has read the cursor but not yet the open prompts runs after it, not between."""
    rules = make_rules(outstanding=4)
    inside, go = threading.Event(), threading.Event()
    state = rules.source.state

    def paused_state():
        inside.set()
        assert go.wait(10)
        return state()

    rules.source.state = paused_state
    snapshots = []
    taker = threading.Thread(target=lambda: snapshots.append(rules.snapshot()))
    taker.start()
    assert inside.wait(10)
    dispatcher = threading.Thread(target=rules.dispatch, args=(0,))
    dispatcher.start()
    dispatcher.join(0.3)
    assert dispatcher.is_alive()  # blocked by the snapshot's lock
    go.set()
    taker.join()
    dispatcher.join()
    assert snapshots[0]["data"]["cursor"] == 0 and snapshots[0]["redo"] == []
    assert rules.snapshot()["data"]["cursor"] == 4 and len(rules.snapshot()["redo"]) == 4


def saved_run(tmp_path, versions=(1, 2)):
    """A run directory with a committed checkpoint of each of `versions` (weights 100 floats
    of the version, so that the array file is larger than Orbax's small metadata files)."""
    state = run_state(tmp_path, make_rules())
    for version in versions:
        state.save(big_state(version), step=4 * version, version=version, reward_mean=0.5)
    state.close()


def big_state(value: float):
    return {"w": np.full(100_000, value, np.float32), "step": np.int32(value)}


BIG = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), big_state(0.0))


def truncate(path, size=100):
    with open(path, "r+b") as f:
        f.truncate(size)


def largest_file(directory):
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["array", "record"])
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_previous_one_restored(tmp_path, damage):
    saved_run(tmp_path)
    latest = tmp_path / "checkpoints" / "2"
    if damage == "array":  # cut short by a full disk or a power loss
        truncate(largest_file(latest / "state"))
    else:
        (latest / "record" / "metadata").write_text('{"step": 8, "versions": [{"vers')

    warnings = []
    state = run_state(tmp_path, make_rules(), warnings=warnings)
    restored = state.restore(BIG)
    assert (restored.version, restored.step) == (1, 4) and restored.state["w"][0] == 1.0
    assert len(warnings) == 1 and "checkpoint 2 is damaged" in warnings[0] and "version 1" in warnings[0]
    assert not latest.exists() and len(list((tmp_path / "damaged-checkpoints").iterdir())) == 1
    state.save(big_state(2.0), step=8, version=2, reward_mean=0.5)  # version 2 is written again
    state.close()
    assert Checkpoints(tmp_path / "checkpoints", keep=None).versions() == [1, 2]


def test_when_no_checkpoint_restores_nothing_is_moved_and_the_error_names_each(tmp_path):
    saved_run(tmp_path)
    for version in (1, 2):
        truncate(largest_file(tmp_path / "checkpoints" / str(version) / "state"))
    with pytest.raises(RuntimeError, match="no checkpoint .* restores: version 2: .*; version 1: ") as e:
        run_state(tmp_path, make_rules()).restore(BIG)
    assert not isinstance(e.value, Unrecoverable)  # damage on a disk a retry may see mended
    assert Checkpoints(tmp_path / "checkpoints", keep=None).versions() == [1, 2]


def test_a_checkpoint_the_spec_does_not_fit_fails_without_retry_and_is_not_moved(tmp_path):
    """The spec's model changed (model.d_model 16 -> 32): every checkpoint fails to restore,
    the same way on every retry, and none of them is damaged."""
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    learner = LearnerConfig(buckets=(16,))
    state = run_state(tmp_path, make_rules())
    for version in (1, 2):
        state.save(init_train_state(tiny_model(16), learner, seed=0, mesh=mesh), step=4 * version,
                   version=version, reward_mean=0.5)
    state.close()

    warnings = []
    with pytest.raises(Unrecoverable) as e:
        run_state(tmp_path, make_rules(), warnings=warnings).restore(
            abstract_train_state(tiny_model(32), learner, mesh))
    message = str(e.value)
    assert message.startswith(f"checkpoint 2 in {tmp_path.resolve() / 'checkpoints'} does not fit this spec:")
    assert "params.embed.embedding: the checkpoint's shape (100, 16), the spec's (100, 32)" in message
    assert "the spec's model and learner sections must match the run's" in message
    assert warnings == [] and not (tmp_path / "damaged-checkpoints").exists()
    assert Checkpoints(tmp_path / "checkpoints", keep=None).versions() == [1, 2]
    # A tree the checkpoints do not hold (learner.loss.kl_coef > 0 keeps a reference copy): the same.
    with pytest.raises(Unrecoverable, match=r"reference\.embed\.embedding: not in the checkpoint"):
        run_state(tmp_path, make_rules()).restore(abstract_train_state(
            tiny_model(16), learner.model_copy(update={"loss": LossConfig(kl_coef=0.1)}), mesh))


def tiny_model(d_model: int) -> ModelConfig:
    return ModelConfig(d_model=d_model, n_heads=2, n_kv_heads=1, d_ff=32, max_len=16)
