"""Demonstrations: drawn from an environment's expert or read from a file, and laid out
as the actors lay out an episode."""

import json

import pytest

from learner.chat import make_tokenizer
from learner.config import FieldError, ModelConfig
from learner.trajectory import OBSERVATION
from tasks.actors.envs.calculator import Calculator
from tasks.actors.envs.guess_number import GuessNumber
from tasks.config import WarmupConfig
from tasks.warmup.demonstrations import Demonstration, demonstrations, played, read_demonstrations, to_sample

MODEL = ModelConfig(max_len=16, tokenizer={"alphabet": "0123456789+-*=?"})


def test_the_expert_is_played_through_the_environment_for_its_observations():
    assert played(Calculator(), "3+4") == Demonstration(("3+4", "7"), ("=", "7"))


def test_an_expert_that_loses_is_named_unless_the_environment_says_it_may():
    class Losing(Calculator):
        def demonstration(self, prompt):
            return ["=", "0"]

    with pytest.raises(FieldError, match=r"the expert's demonstration of '3\+4' loses"):
        played(Losing(), "3+4")
    careless = Losing()
    careless.expert_may_lose = True
    assert played(careless, "3+4") == Demonstration(("3+4", "7"), ("=", "0"))


def test_env_demonstrations_are_deterministic_and_skip_held_out_prompts():
    config = WarmupConfig(examples=40)
    first = demonstrations(config, Calculator, {}, seed=3)
    assert first == demonstrations(config, Calculator, {}, seed=3) and len(first) == 40
    held = frozenset(d.observations[0] for d in first[:5])
    assert not held & {d.observations[0] for d in demonstrations(config, Calculator, {}, seed=3, held_out=held)}


def test_an_environment_without_an_expert_is_named():
    with pytest.raises(FieldError, match="warmup.source: GuessNumber has no demonstration"):
        demonstrations(WarmupConfig(), GuessNumber, {}, seed=0)


def test_a_demonstration_is_laid_out_as_an_episode_and_only_the_actions_train():
    tokenizer = make_tokenizer(MODEL)
    sample = to_sample(Demonstration(("3+4", "7"), ("=", "7")), tokenizer, MODEL.max_len, 0)
    eos = tokenizer.stop_ids[0]
    expected = tokenizer.start() + tokenizer.encode("3+4") + tokenizer.encode("=") + [eos] + \
        tokenizer.encode("7") + tokenizer.encode("7") + [eos]
    assert sample.tokens.tolist() == expected
    assert sample.generated.tolist() == [False] * 4 + [True, True, False, True, True]
    assert set(sample.versions[sample.generated].tolist()) == {0}
    assert (sample.versions[~sample.generated] == OBSERVATION).all() and not sample.logprobs.any()


def test_a_demonstration_longer_than_the_context_or_outside_the_alphabet_is_named():
    tokenizer = make_tokenizer(MODEL)
    with pytest.raises(FieldError, match="demonstration 7 is 18 tokens, longer than the context window"):
        to_sample(Demonstration(("3+4" * 5,), ("7",)), tokenizer, MODEL.max_len, 7)
    with pytest.raises(FieldError, match="demonstration 2: .*'x'"):
        to_sample(Demonstration(("x",), ("7",)), tokenizer, MODEL.max_len, 2)


def test_a_file_of_demonstrations_is_read_and_a_bad_line_named(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"observations": ["3+4", "7"], "actions": ["=", "7"]}) + "\n\n")
    assert read_demonstrations(good) == [Demonstration(("3+4", "7"), ("=", "7"))]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + json.dumps({"observations": ["3+4"], "actions": ["=", "7"]}) + "\n")
    with pytest.raises(FieldError, match="bad.jsonl line 3: expected"):
        read_demonstrations(bad)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(FieldError, match="holds no demonstrations"):
        read_demonstrations(tmp_path / "empty.jsonl")
