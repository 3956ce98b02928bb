"""Playing an eval through the actors' engine and rollout: greedy is deterministic, and its
episodes are the ones scored."""

import dataclasses
from pathlib import Path

import jax

from flows.spec import parse_spec
from learner.model import init_params
from learner.serialization import params_to_bytes
from tasks.actors.envs import resolve_entrypoint
from tasks.actors.generation import GenerationService
from tasks.eval import play as play_module
from tasks.eval.play import EvalSetup, play_eval
from tasks.eval.prompts import eval_prompts


def setup_of(*overrides):
    spec = parse_spec(Path("specs/guess-number.yaml").read_text(), ["eval.every=5", *overrides])
    prompts = eval_prompts(spec.eval, resolve_entrypoint(spec.env.entrypoint), spec.env.kwargs)
    return spec, EvalSetup(spec.eval, spec.env, spec.actors, spec.model, tuple(prompts))


def test_greedy_eval_of_fixed_weights_is_deterministic():
    spec, setup = setup_of("eval.n=3")
    weights = params_to_bytes(jax.device_get(init_params(spec.model, 3)))
    first, again = play_eval(setup, weights, 7), play_eval(setup, weights, 7)
    assert first["episodes"] == again["episodes"]
    assert {k: v for k, v in first["scores"].items() if k != "eval_s"} == \
        {k: v for k, v in again["scores"].items() if k != "eval_s"}
    # The same episodes in an engine of one slot: one at a time, not batched together.
    one_slot = dataclasses.replace(setup, eval=setup.eval.model_copy(update={"slots": 1}))
    assert play_eval(one_slot, weights, 7)["episodes"] == first["episodes"]
    episode = first["episodes"][0]
    assert episode["prompt"] == setup.prompts[0] and episode["turns"][0]["observation"] == ":"
    assert all(turn["versions"] == [7] for e in first["episodes"] for turn in e["turns"])
    assert first["scores"]["episodes"] == 3 == len(first["episodes"])


def test_sampled_eval_reports_pass_at_k():
    spec, setup = setup_of("eval.n=2", "eval.decoding=sampled", "eval.k=4")
    outcome = play_eval(setup, params_to_bytes(jax.device_get(init_params(spec.model, 0))), 0)
    assert outcome["scores"]["episodes"] == 8 == len(outcome["episodes"])
    assert 0.0 <= outcome["scores"]["pass_at_4"] <= 1.0
    assert outcome["scores"]["pass_at_4"] >= outcome["scores"]["success_rate"]


def test_an_eval_compiles_before_its_first_episode_and_nothing_after(monkeypatch):
    """The first eval in a process compiled a new shape at every turn, its episodes' clock
    running (11 of 12 timed out): its engine is warmed up first, for all its episodes at once."""
    seen = {}

    class Recording(GenerationService):
        def warm_up(self, in_flight: int) -> float:
            seconds = super().warm_up(in_flight)
            seen["in_flight"], seen["warmed"] = in_flight, dict(self.engine.compiles)
            return seconds

        def stop(self, timeout_s: float = 10.0) -> bool:
            seen["played"] = dict(self.engine.compiles)
            return super().stop(timeout_s)

    monkeypatch.setattr(play_module, "GenerationService", Recording)
    spec, setup = setup_of("eval.n=3", "eval.slots=8")
    outcome = play_eval(setup, params_to_bytes(jax.device_get(init_params(spec.model, 3))), 7)
    assert outcome["scores"]["aborted"] == 0 and seen["in_flight"] == 3
    assert seen["warmed"] == seen["played"] == {"prefill": 3, "suffix": 12, "decode": 1}  # K 1, 2, 4
