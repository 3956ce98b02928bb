"""`tandem audit`: the pool model against hand-computed rates, and one real audit of a tiny spec."""

import json
import math

import pytest

from flows.audit import Pool, predict, recommend, spec_pool, warnings
from flows.cli import main
from flows.spec import parse_spec
from tasks.measure import Measurements


def measurements(group_compute=0.05, turns=4, latency=0.5, kept=1.0, step=0.2, batch=0.0, publish=0.0):
    return Measurements(env_step_s=(0.001,) * 10, latency_s=latency, group_compute_s=(group_compute,) * 4,
                        group_turns=(turns,) * 4, kept=kept, train_step_s=(step,) * 3, compile_s=1.0,
                        batch_s=batch, publish_s=publish)


def test_prediction_is_the_slower_of_producing_and_consuming():
    m = measurements()  # a group takes 0.05 + 4 * 0.5 = 2.05 s; the learner eats 4 groups / 0.2 s
    few = predict(m, Pool(actors=4, actor_cores=1, batch_groups=4, sync_interval=1))
    assert few.produced == pytest.approx(4 / 2.05)
    assert few.busy_async == pytest.approx((4 / 2.05) / 20)
    assert few.busy_sync == pytest.approx(0.2 / (2.05 + 0.2))  # one wave of 4 groups, then a step
    many = predict(m, Pool(actors=100, actor_cores=8, batch_groups=4, sync_interval=1))
    assert many.busy_async == pytest.approx(1.0)
    assert many.groups_per_s_async == pytest.approx(20.0)


def test_actor_cores_cap_production_and_rejections_lower_it():
    m = measurements(kept=0.5)
    p = predict(m, Pool(actors=100, actor_cores=1, batch_groups=4, sync_interval=1))
    assert p.produced == pytest.approx(0.5 * 1 / 0.05)  # one core finishes 20 groups/s, half kept
    assert p.busy_sync == pytest.approx(0.2 / (2.05 + 0.2))


def test_groups_beyond_inline_bytes_cost_the_scheduler_their_scatter_and_fetch():
    m = measurements()
    spec = parse_spec("name: t\nmodel: {max_len: 16}\nactors: {group_size: 8}\n")  # groups of ≤ 1536 bytes
    inline = spec_pool(spec)
    beyond = spec_pool(parse_spec("name: t\nmodel: {max_len: 16}\nactors: {group_size: 8}\n"
                                  "buffer: {inline_bytes: 1000}\n"))
    assert inline.inline and not beyond.inline
    assert predict(m, beyond).scheduler_ops == pytest.approx(predict(m, inline).scheduler_ops * 9 / 7)


def test_recommendation_reaches_the_target():
    m = measurements(publish=0.02)  # publishing costs 10% of a step: sync every 2 steps keeps it ≤ 5%
    r = recommend(m, batch_groups=4, target_busy=0.9)
    assert r.sync_interval == 2
    assert r.actors == math.ceil(0.9 * 4 / 0.2 * 2.05)
    assert r.capacity == 8
    assert 0.9 <= r.busy <= 1.0


def test_warnings_name_saturation_and_idle_local_actors():
    spec = parse_spec("actors: {workers: 2, actors: 8}\nbuffer: {capacity: 8}\nlearner: {batch_groups: 4}")
    pool = spec_pool(spec, actor_cores=2)
    assert pool.actors == 2  # a local worker runs one actor at a time
    m = measurements(group_compute=0.001, latency=0.0, step=1.0)
    found = warnings(m, spec, pool, predict(m, pool), target_busy=0.9)
    assert any("never start" in w for w in found)
    assert any("outpace" in w for w in found)
    assert any("scheduler ops/s" in w for w in found)


def test_audit_of_a_tiny_spec_prints_a_sane_prediction_and_recommendation(tmp_path, capsys):
    tiny = ["model.d_model=16", "model.n_layers=1", "model.d_ff=32", "actors.group_size=2",
            "learner.batch_groups=4", "env.latency_s=0.1"]  # 8 rows: one per test device
    out = tmp_path / "audit.json"
    code = main(["audit", "specs/guess-number.yaml", *[a for o in tiny for a in ("--set", o)],
                 "--groups", "2", "--train-steps", "2", "--env-steps", "20", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "predicted learner busy" in printed and "recommended for learner busy 90%" in printed
    audit = json.loads(out.read_text())
    m = audit["measurements"]
    assert len(m["env_step_s"]) == 20 and len(m["group_compute_s"]) == 2
    assert 1 <= min(m["group_turns"]) <= 5 and 0.0 <= m["kept"] <= 1.0
    assert 0.0 <= audit["prediction"]["busy_async"] <= 1.0
    assert 0.0 <= audit["prediction"]["busy_sync"] <= audit["prediction"]["busy_async"] + 1e-9
    assert audit["recommendation"]["actors"] >= 1
    assert audit["recommendation"]["capacity"] >= 2
