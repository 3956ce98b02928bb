"""Eval prompts are held out: training never draws one, from the environment or a file."""

import json

import pytest

from flows.spec import SpecError, parse_spec
from tasks.actors.envs.calculator import Calculator
from tasks.actors.envs.guess_number import GuessNumber
from tasks.buffer.prompts import PromptSource
from tasks.config import DataConfig, EvalConfig
from tasks.eval.prompts import eval_prompts, held_out


def test_env_prompts_are_distinct_deterministic_and_of_their_own_stream():
    config = EvalConfig(every=5, n=3)
    prompts = eval_prompts(config, GuessNumber, {})
    assert prompts == eval_prompts(config, GuessNumber, {}) and len(set(prompts)) == 3
    assert eval_prompts(config.model_copy(update={"seed": 1}), Calculator, {}) != eval_prompts(config, Calculator, {})
    # Fewer distinct tasks than asked for: all there are.
    assert sorted(eval_prompts(EvalConfig(n=40), GuessNumber, {"values": 4})) == [f"secret={c}" for c in "abcd"]


def test_training_never_draws_an_eval_prompt_from_the_environment():
    config = EvalConfig(every=5, n=3)
    evals = set(eval_prompts(config, GuessNumber, {}))
    source = PromptSource(DataConfig(), GuessNumber, {}, seed=0, held_out=held_out(config, GuessNumber, {}))
    drawn = {source.next().text for _ in range(2000)}
    assert drawn.isdisjoint(evals) and len(drawn) == 12 - 3
    # Without evaluation during training, nothing is held out: the draws are as before.
    plain, unheld = PromptSource(DataConfig(), GuessNumber, {}, seed=0), PromptSource(
        DataConfig(), GuessNumber, {}, seed=0, held_out=held_out(EvalConfig(n=3), GuessNumber, {}))
    assert [plain.next() for _ in range(50)] == [unheld.next() for _ in range(50)]


def test_an_eval_not_held_out_leaves_training_its_draws():
    # guess-number's spec evaluates every letter: its agent never sees the task.
    config = EvalConfig(every=5, n=12, held_out=False)
    assert sorted(eval_prompts(config, GuessNumber, {})) == [f"secret={c}" for c in "abcdefghijkl"]
    assert held_out(config, GuessNumber, {}) == frozenset()
    parse_spec("eval: {every: 5, n: 12, held_out: false}\n")  # nothing held out: nothing refused


def test_training_never_draws_an_eval_prompt_from_a_file(tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("1+2", "3+4", "5+6")))
    held.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("3+4", "7+8", "3+4")))
    config = EvalConfig(every=2, prompts=str(held))
    assert eval_prompts(config, Calculator, {}) == ["3+4", "7+8"]
    source = PromptSource(DataConfig(source=str(train)), Calculator, {}, 0, held_out=held_out(config, Calculator, {}))
    assert [source.next().text for _ in range(4)] == ["1+2", "5+6", "1+2", "5+6"]


def test_a_spec_whose_eval_holds_out_every_training_prompt_is_refused():
    with pytest.raises(SpecError) as error:
        parse_spec("env: {kwargs: {values: 4}}\neval: {every: 5, n: 4}\n")
    (issue,) = error.value.issues
    assert issue.path == "eval.n" and "hold out fewer" in issue.message
    with pytest.raises(SpecError) as error:
        parse_spec("eval: {every: 5, decoding: greedy, k: 4}\n")
    assert [(i.path, i.line) for i in error.value.issues] == [("eval.k", 1)]


def test_due_versions():
    assert [v for v in range(12) if EvalConfig(every=5).due(v)] == [5, 10]
    assert not any(EvalConfig().due(v) for v in range(12))
