import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.cli import main
from flows.spec import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))

BAD = """\
name: bad
env:
  entrypoint: guess-number
  colour: red
buffer:
  capacity: -3
learner:
  steps: many
"""


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_shipped_spec_validates(path):
    spec = load_spec(path)
    assert spec.name == path.stem


def test_defaults_fill_every_section():
    spec = parse_spec("name: x\n")
    assert spec.buffer.capacity == 32 and spec.buffer.max_staleness is None
    assert spec.run_dir == Path("runs/x")
    assert spec.model.vocab_size == 3 + len(spec.model.tokenizer.alphabet)


def test_all_errors_reported_with_path_and_line():
    with pytest.raises(SpecError) as e:
        parse_spec(BAD)
    assert [str(i) for i in e.value.issues] == [
        "env.colour (line 4): unknown field",
        "buffer.capacity (line 6): Input should be greater than 0",
        "learner.steps (line 8): Input should be a valid integer, unable to parse string as an integer",
    ]


def test_validate_command_prints_errors_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "env.colour (line 4): unknown field" in err
    assert "buffer.capacity (line 6)" in err and "learner.steps (line 8)" in err


def test_console_script_is_installed(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    tandem = Path(sys.executable).parent / "tandem"
    result = subprocess.run([str(tandem), "validate", str(path)], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown field" in result.stderr


def test_overrides_are_yaml_and_validated():
    spec = parse_spec("name: x\nbuffer: {max_staleness: 2}\n",
                      ["buffer.max_staleness=null", "env.kwargs={}", "learner.buckets=[32, 64]"])
    assert spec.buffer.max_staleness is None and spec.env.kwargs == {}
    assert spec.learner.buckets == (32, 64)
    with pytest.raises(SpecError) as e:
        parse_spec("name: x\n", ["buffer.capacity=-1", "learner.steps=0"])
    assert [str(i) for i in e.value.issues] == [
        "buffer.capacity (--set): Input should be greater than 0",
        "learner.steps (--set): Input should be greater than 0",
    ]
    with pytest.raises(SpecError, match="path.to.field=value"):
        parse_spec("name: x\n", ["buffer.capacity"])


def test_invalid_yaml_names_the_line():
    with pytest.raises(SpecError) as e:
        parse_spec("name: x\nenv: {entrypoint: [\n")
    assert e.value.issues[0].line == 3


def test_cross_field_check_names_the_fields():
    with pytest.raises(SpecError) as e:
        parse_spec("model: {max_len: 64}\nlearner: {buckets: [32]}\n")
    assert str(e.value.issues[0]).startswith("learner.buckets (line 2): the largest bucket (32)")


def test_sync_mode_publishes_once_per_batch():
    assert parse_spec("learner: {mode: sync, epochs: 2}\nsync: {interval: 2}\n").sync.interval == 2
    with pytest.raises(SpecError) as e:
        parse_spec("learner: {mode: sync, epochs: 2}\nsync: {interval: 1}\n")
    assert str(e.value.issues[0]).startswith("sync.interval (line 2): learner.mode sync publishes once per batch")


def test_spec_is_frozen():
    spec = parse_spec("name: x\n")
    with pytest.raises(Exception):
        spec.buffer.capacity = 3


# Property: a randomly mutated spec either validates or raises SpecError — never anything else.
_DEFAULT = yaml.safe_load((ROOT / "specs" / "guess-number.yaml").read_text())
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))


_ALL_PATHS = list(_paths(_DEFAULT))[1:]


@settings(max_examples=300, deadline=None)
@given(mutations=st.lists(st.tuples(st.sampled_from(_ALL_PATHS), _values, st.booleans()), max_size=4))
def test_mutated_specs_validate_or_fail_clearly(mutations):
    import copy

    data = copy.deepcopy(_DEFAULT)
    for path, value, delete in mutations:
        target = data
        for key in path[:-1]:
            if not isinstance(target, dict) or not isinstance(target.get(key), dict):
                break
            target = target[key]
        else:
            if isinstance(target, dict):
                if delete:
                    target.pop(path[-1], None)
                else:
                    target[path[-1]] = value
    text = yaml.safe_dump(data)
    try:
        parse_spec(text)
    except SpecError as e:
        assert e.issues and all(str(i) for i in e.issues)
        for issue in e.issues:
            assert issue.line is not None and issue.line >= 1
