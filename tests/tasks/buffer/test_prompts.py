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


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"data\.source: .*p\.jsonl line 2: not UTF-8 \(byte 0xe9 at offset 15"):
        source(source=str(path))


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.jsonl", "cannot read .*missing.jsonl: No such file or directory"),
    (lambda d: d, r"is not a regular file \(a directory\)"),
    (lambda d: (d / "empty.jsonl", (d / "empty.jsonl").write_text("\n\n"))[0], "empty.jsonl holds no prompts"),
])
def test_unreadable_jsonl_is_a_value_error(tmp_path, make, message):
    with pytest.raises(ValueError, match=rf"^data\.source: .*{message}"):
        source(source=str(make(tmp_path)))


def test_jsonl_lines_split_on_newlines_only(tmp_path):
    # A prompt may hold line separators JSON allows unescaped (U+2028, U+0085): not line ends.
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a\u2028b\x85c"}\r\n{"prompt": "d"}\n', encoding="utf-8")
    s = source(source=str(path))
    assert [s.next().text for _ in range(2)] == ["a\u2028b\x85c", "d"]
