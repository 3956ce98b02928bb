import json

import pytest

from tasks.config import DataConfig
from tasks.buffer.prompts import Prompt, PromptSource
from tasks.actors.envs.guess_number import GuessNumber


def source(seed=0, **config):
    return PromptSource(DataConfig(**config), GuessNumber, {}, seed)


def test_prompts_are_deterministic_in_seed_and_id():
    a, b = source(), source()
    assert [a.next() for _ in range(5)] == [b.next() for _ in range(5)]
    assert [p.id for p in [a.next(), a.next()]] == [5, 6]
    s0, s1 = source(seed=0), source(seed=1)
    assert [s0.next().text for _ in range(10)] != [s1.next().text for _ in range(10)]


def test_again_goes_ahead_of_new_prompts():
    s = source()
    first = s.next()
    s.again(Prompt(first.id, first.text, first.attempt + 1))
    assert s.next() == Prompt(0, first.text, 1)
    assert s.next().id == 1


def test_restored_cursor_replays_the_same_prompts():
    a = source()
    [a.next() for _ in range(3)]
    a.again(Prompt(1, "secret=b", 2))
    state = json.loads(json.dumps(a.state()))
    expected = [a.next() for _ in range(4)]
    b = source()
    b.restore(state)
    assert [b.next() for _ in range(4)] == expected


def test_jsonl_source(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "secret=a"}\n\n{"prompt": "secret=b"}\n')
    s = source(source=str(path))
    assert [s.next().text for _ in range(3)] == ["secret=a", "secret=b", "secret=a"]


def test_bad_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"text": 1}\n')
    with pytest.raises(ValueError, match=r"p.jsonl line 2"):
        source(source=str(path))
