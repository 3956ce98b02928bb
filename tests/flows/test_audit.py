"""`tandem audit`: the pool model against hand-computed rates, and one real audit of a tiny spec."""

import json
import math

import pytest

from flows.audit import BATCH_GROWTH, BUDGET_GROWTH, IDLE, STALENESS_BUDGET, Pool, predict, recommend, spec_pool, warnings
from flows.cli import main
from flows.spec import parse_spec
from tasks.measure import Measurements


def measurements(group_compute=0.05, turns=4, latency=0.5, kept=1.0, rate=100.0, step=0.2, batch=0.0,
                 publish=0.0, tokens=9.0):
    return Measurements(env_step_s=(0.001,) * 10, latency_s=latency, group_compute_s=(group_compute,) * 4,
                        group_turns=(turns,) * 4, episode_tokens=tokens, kept=kept, actor_groups_per_s=rate,
                        train_step_s=(step,) * 3, compile_s=1.0, batch_s=batch, publish_s=publish)


def test_prediction_is_the_slower_of_producing_and_consuming():
    m = measurements()  # a group takes 0.05 + 4 * 0.5 = 2.05 s; the learner eats 4 groups / 0.2 s
    few = predict(m, Pool(workers=1, actors=4, batch_groups=4, sync_interval=1))
    assert few.produced == pytest.approx(4 / 2.05)
    assert few.busy_async == pytest.approx((4 / 2.05) / 20)
    assert few.busy_sync == pytest.approx(0.2 / (2.05 + 0.2))  # one wave of 4 groups, then a step
    many = predict(m, Pool(workers=1, actors=100, batch_groups=4, sync_interval=1))
    assert many.busy_async == pytest.approx(1.0)


def test_the_engine_caps_what_a_process_produces_and_rejections_lower_it():
    m = measurements(kept=0.5, rate=10.0)
    p = predict(m, Pool(workers=2, actors=1000, batch_groups=4, sync_interval=1))
    assert p.produced == pytest.approx(0.5 * 2 * 10.0)  # two processes of 10 groups/s, half kept


def test_staleness_grows_with_the_update_rate_and_the_time_in_flight():
    m = measurements(step=0.1)  # the learner could take 40 groups/s
    fed = Pool(workers=1, actors=100, batch_groups=4, sync_interval=1, capacity=4)
    retract, finish = predict(m, fed), predict(m, Pool(**{**fed.__dict__, "retract": False}))
    rate = 10.0  # updates/s: fed, busy 100%
    queue_s = (4 + 4) / 40.0  # the actors outpace it: the buffer's groups and the batch in training wait
    assert retract.staleness_updates == pytest.approx(rate * (0.5 * 2.05 + queue_s))
    assert finish.staleness_updates == pytest.approx(rate * (2.05 + queue_s))
    interval = predict(m, Pool(**{**fed.__dict__, "sync_interval": 4}))
    assert interval.staleness_updates == pytest.approx(retract.staleness_updates + 1.5)
    assert interval.staleness_versions == pytest.approx(interval.staleness_updates / 4)


def test_async_recommendation_feeds_the_learner_and_no_more():
    spec = parse_spec("learner: {batch_groups: 4, buckets: [16]}\nactors: {groups_per_worker: 2}\n"
                      "model: {max_len: 16}\n")
    m = measurements(step=0.2, latency=0.5, publish=0.002)
    r = recommend(m, spec, "async", workers=1)
    needed = 1.15 * 4 / 0.2  # groups/s, with headroom
    assert r.actors == -(-needed * 2.05 // 1)
    assert 0.95 <= r.busy <= 1.0 and r.sync_interval == 1 and r.capacity == 4
    # 32 samples of ~9 tokens: 16 rows of 32 (a multiple of 8), as many slots as 32 rows of 16
    assert r.rows == 16 and r.buckets == (32, 64)
    assert "actors.on_sync=retract" in r.overrides and f"actors.groups_per_worker={r.actors}" in r.overrides
    assert "buffer.admission=true" in r.overrides and r.max_staleness == STALENESS_BUDGET  # 48 open: not binding
    sync = recommend(m, spec, "sync", workers=1)
    assert sync.actors == 5 and sync.sync_interval == 1 and sync.max_staleness is None  # a batch in one wave


def test_admission_caps_the_groups_open_at_what_the_budget_lets_the_learner_take():
    m = measurements(step=0.1)  # a group takes 2.05 s; the learner could take 40 groups/s
    free = Pool(workers=1, actors=100, batch_groups=4, sync_interval=1)
    bounded = predict(m, Pool(**{**free.__dict__, "admission": 3}))
    assert bounded.produced == pytest.approx((3 + 1) * 4 / 2.05)  # 16 open at most, 2.05 s each
    assert bounded.staleness_updates == pytest.approx(bounded.produced / 4 * (0.5 * 2.05 + 4 / bounded.produced))
    assert bounded.staleness_updates < predict(m, free).staleness_updates


def test_async_recommendation_stops_at_the_staleness_budget_when_feeding_the_learner_needs_more():
    spec = parse_spec("learner: {batch_groups: 16, buckets: [16]}\nactors: {groups_per_worker: 2}\n"
                      "model: {max_len: 16}\n")
    m = measurements(step=0.04, latency=0.5, publish=0.0001, rate=1000.0)  # feeding it: 1.15 * 400 groups/s * 2.05 s
    r = recommend(m, spec, "async", workers=1)
    assert r.max_staleness == STALENESS_BUDGET and "buffer.admission=true" in r.overrides
    assert r.actors == -(-1.15 * (STALENESS_BUDGET + 1) * 16 // 1)  # what the budget admits, not 943
    assert r.busy < 0.5 and r.staleness_updates < STALENESS_BUDGET


def test_where_the_budget_leaves_the_learner_idle_each_version_carries_more_groups():
    """A slow env: the budget admits a version every few seconds while a step takes ms, so
    the batch and the budget grow (and the train step with the batch); sync keeps its batch."""
    spec = parse_spec("learner: {batch_groups: 16, buckets: [16]}\nactors: {groups_per_worker: 2}\n"
                      "model: {max_len: 16}\n")
    fast = recommend(measurements(step=0.04, latency=0.5, publish=0.0001, rate=1000.0), spec, "async", workers=1)
    assert fast.busy >= IDLE and fast.batch_groups == 16 and fast.max_staleness == STALENESS_BUDGET
    slow_env = measurements(step=0.04, latency=8.0, publish=0.0001, rate=1000.0)  # a group takes 32 s
    slow = recommend(slow_env, spec, "async", workers=1)
    assert slow.batch_groups == BATCH_GROWTH * 16 and slow.capacity == slow.batch_groups
    assert slow.max_staleness == BUDGET_GROWTH * STALENESS_BUDGET and "learner.batch_groups=64" in slow.overrides
    assert "the budget, not the learner, sets the pace" in slow.why[0]
    # the grown batch's samples packed as the spec's are: 512 samples of ~9 tokens in rows of 32
    assert slow.rows == -(-math.ceil(1.25 * 512 * 9.0 / 32) // 8) * 8
    idle = predict(slow_env, Pool(workers=1, actors=slow.actors, batch_groups=16, sync_interval=1,
                                  admission=STALENESS_BUDGET))
    assert idle.busy_async < IDLE < slow.busy  # what the growth buys: a learner fed 4x per version
    assert recommend(slow_env, spec, "sync", workers=1).batch_groups == 16


def test_async_recommendation_opens_no_more_groups_than_the_actor_cores_can_play():
    """Actors bound by their own CPU (a sandboxed tool, say) finish no more groups for
    having more open: past the core's rate, groups only queue on it."""
    spec = parse_spec("learner: {batch_groups: 16, buckets: [16]}\nactors: {groups_per_worker: 2}\n"
                      "model: {max_len: 16}\n")
    m = measurements(step=0.04, latency=0.5, publish=0.0001, rate=4.0)  # 4 groups/s of 2.05 s each
    r = recommend(m, spec, "async", workers=2)
    assert r.actors == -(-1.15 * 4.0 * 2 * 2.05 // 2)  # per worker: the cores' groups/s x a group's seconds
    (starved,) = [w for w in r.why if w.startswith("the actors cannot feed the learner")]
    assert starved == ("the actors cannot feed the learner (8.0 kept groups/s of the 556.0 it could take): more "
                       "actor cores (actors.workers, on more machines: actors.cluster) would keep it busier; "
                       "more groups at once on these cores would not")  # a whole sentence, not cut at "would"


def test_each_recommendation_applies_to_a_spec_with_admission_on():
    """The built-in specs run async with admission; a sync recommendation turns it off
    (sync has no budget: it would fail validation beside max_staleness null)."""
    spec = parse_spec("buffer: {max_staleness: 16, admission: true}\nlearner: {batch_groups: 4, buckets: [16]}\n"
                      "model: {max_len: 16}\n")
    for mode in ("sync", "async"):
        r = recommend(measurements(), spec, mode, workers=1)
        applied = parse_spec(spec.model_dump_json(), r.overrides)
        assert applied.learner.mode == mode and applied.buffer.admission == (mode == "async")


def test_warnings_name_outpacing_and_starving():
    spec = parse_spec("actors: {workers: 1, groups_per_worker: 64}\nbuffer: {capacity: 8}\nlearner: {batch_groups: 4}")
    m = measurements(group_compute=0.001, latency=0.0, step=1.0)
    assert any("outpace" in w for w in warnings(m, spec, spec_pool(spec), predict(m, spec_pool(spec))))
    m = measurements(kept=0.0)
    assert any("starve" in w for w in warnings(m, spec, spec_pool(spec), predict(m, spec_pool(spec))))


@pytest.mark.slow  # 37 s on 2 cores: CI's time (README, "The two commands")
def test_audit_of_a_tiny_spec_prints_a_sane_prediction_and_recommendation(tmp_path, capsys):
    tiny = ["model.d_model=16", "model.n_layers=1", "model.d_ff=32", "actors.group_size=2",
            "learner.batch_groups=4", "env.latency_s=0.1", "actors.groups_per_worker=4"]  # 8 rows: one per test device
    out = tmp_path / "audit.json"
    code = main(["audit", "specs/guess-number.yaml", *[a for o in tiny for a in ("--set", o)],
                 "--groups", "2", "--train-steps", "2", "--env-steps", "20", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "predicted learner busy" in printed and "recommended for learner.mode async" in printed
    audit = json.loads(out.read_text())
    m = audit["measurements"]
    assert len(m["env_step_s"]) == 20 and len(m["group_compute_s"]) == 2
    assert 1 <= min(m["group_turns"]) <= 5 and 0.0 <= m["kept"] <= 1.0 and m["actor_groups_per_s"] > 0
    assert 0.0 <= audit["prediction"]["busy_async"] <= 1.0
    assert audit["recommendation"]["actors"] >= 4 and audit["recommendation"]["staleness_updates"] >= 0
    assert parse_spec("name: x\n", audit["recommendation"]["overrides"])  # valid --set values
