import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.cli import main
from flows.spec import RenamedField, SpecError, load_spec, parse_spec

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
def test_every_shipped_spec_validates(path, shipped_models):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedField)  # written with every field's current name
        spec = load_spec(path)
    assert spec.name == path.stem


def test_defaults_fill_every_section():
    spec = parse_spec("name: x\n")
    assert spec.buffer.capacity == 16 and spec.buffer.max_staleness is None
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


def test_the_kv_cache_dtype_follows_the_model_unless_set():
    assert parse_spec("name: x\n").actors.kv_cache_dtype is None
    assert parse_spec("name: x\nactors: {kv_cache_dtype: bfloat16}\n").actors.kv_cache_dtype == "bfloat16"
    assert _issues("name: x\nactors:\n  kv_cache_dtype: float16\n") == [
        "actors.kv_cache_dtype (line 3): Input should be 'float32' or 'bfloat16'"]


# --- Renamed fields: read under their old names, with a warning -----------------------

OLD_NAME = "name: x\nactors:\n  workers: 2\n  actors: 4\n"  # actors.actors: now actors.groups_per_worker
NEW_NAME = OLD_NAME.replace("  actors: 4", "  groups_per_worker: 4")


def test_a_renamed_field_in_the_yaml_is_read_with_a_warning_naming_its_line(tmp_path, capsys):
    assert issubclass(RenamedField, FutureWarning)  # shown by default, to whoever runs tandem
    with pytest.warns(RenamedField) as caught:
        spec = parse_spec(OLD_NAME, source="old.yaml")
    assert [str(w.message) for w in caught] == [
        "old.yaml: actors.actors (line 4) is renamed actors.groups_per_worker; the old name is read for now"]
    assert spec == parse_spec(NEW_NAME)
    assert spec.actors.groups_per_worker == 4 and spec.actors.groups_at_once == 8
    assert "groups_per_worker: 4" in spec.to_yaml() and "  actors: 4" not in spec.to_yaml()
    path = tmp_path / "old.yaml"
    path.write_text(OLD_NAME)
    with pytest.warns(RenamedField, match=r"old\.yaml: actors\.actors \(line 4\) is renamed"):
        assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok (x,")


def test_a_renamed_field_in_an_override_is_read_with_a_warning():
    with pytest.warns(RenamedField, match=r"^<spec>: actors\.actors \(--set\) is renamed actors\.groups_per_worker;"):
        assert parse_spec("name: x\n", ["actors.actors=3"]).actors.groups_per_worker == 3
    with pytest.warns(RenamedField, match=r"actors\.actors \(--set\)"):  # a section given whole, too
        assert parse_spec("name: x\n", ["actors={workers: 2, actors: 3}"]).actors.groups_at_once == 6
    # An override wins whichever name the YAML gave: a run's spec.yaml may hold the old one.
    with pytest.warns(RenamedField, match=r"\(line 4\)"):
        assert parse_spec(OLD_NAME, ["actors.groups_per_worker=5"]).actors.groups_per_worker == 5
    with pytest.warns(RenamedField, match=r"\(--set\)"):
        assert parse_spec(NEW_NAME, ["actors.actors=6"]).actors.groups_per_worker == 6


def test_an_invalid_renamed_field_is_named_as_written():
    with pytest.warns(RenamedField):
        assert _issues(OLD_NAME.replace(": 4", ": 0")) == ["actors.actors (line 4): Input should be greater than 0"]
    with pytest.warns(RenamedField):
        assert _issues(NEW_NAME, ["actors.actors=0"]) == ["actors.actors (--set): Input should be greater than 0"]
    with pytest.warns(RenamedField):  # set by its new name, the YAML's old one is gone
        assert _issues(OLD_NAME, ["actors.groups_per_worker=0"]) == [
            "actors.groups_per_worker (--set): Input should be greater than 0"]


def test_both_names_of_a_renamed_field_are_an_error_naming_both():
    assert _issues(OLD_NAME + "  groups_per_worker: 5\n") == [
        "actors.actors (line 4): the old name of actors.groups_per_worker (line 5), which the spec gives too; "
        "keep actors.groups_per_worker only"]
    refused = ["actors.actors (--set): the old name of actors.groups_per_worker (--set), which the spec gives too; "
               "keep actors.groups_per_worker only"]
    for overrides in (["actors.groups_per_worker=4", "actors.actors=3"],
                      ["actors.actors=3", "actors.groups_per_worker=4"],
                      ["actors={actors: 3, groups_per_worker: 4}"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RenamedField)
            assert _issues("name: x\n", overrides) == refused, overrides


def test_the_new_name_reads_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedField)
        assert parse_spec(NEW_NAME).actors.groups_per_worker == 4
        assert parse_spec(NEW_NAME, ["actors.groups_per_worker=6"]).actors.groups_per_worker == 6


def test_invalid_yaml_names_the_line():
    with pytest.raises(SpecError) as e:
        parse_spec("name: x\nenv: {entrypoint: [\n")
    assert e.value.issues[0].line == 3


def test_cross_field_check_names_the_fields():
    with pytest.raises(SpecError) as e:
        parse_spec("model: {max_len: 64}\nlearner: {buckets: [32]}\n")
    assert str(e.value.issues[0]).startswith("learner.buckets (line 2): the largest bucket (32)")


def test_eval_resources_need_a_cluster_whose_workers_carry_them():
    text = "actors: {cluster: local}\neval: {every: 5, held_out: false, resources: {eval: 1}}\n"
    with pytest.raises(SpecError) as e:
        parse_spec(text)
    assert str(e.value.issues[0]).startswith("eval.resources (line 2): {'eval': 1.0} need Dask workers started with")
    spec = parse_spec(text, ["actors.cluster=tcp://10.0.0.1:8786"])
    assert spec.eval.resources == {"eval": 1.0}


def test_sync_mode_publishes_once_per_batch():
    assert parse_spec("learner: {mode: sync, epochs: 2}\nsync: {interval: 2}\n").sync.interval == 2
    with pytest.raises(SpecError) as e:
        parse_spec("learner: {mode: sync, epochs: 2}\nsync: {interval: 1}\n")
    assert str(e.value.issues[0]).startswith("sync.interval (line 2): learner.mode sync publishes once per batch")


def test_hosts_must_split_every_minibatch_evenly():
    assert parse_spec("learner: {hosts: 2, minibatches: 2, batch_groups: 4}\n").learner.hosts == 2
    with pytest.raises(SpecError) as e:
        parse_spec("learner: {hosts: 3, batch_groups: 4}\n")
    assert str(e.value.issues[0]).startswith("learner.hosts (line 1): a batch's 32 rows")
    with pytest.raises(SpecError) as e:
        parse_spec("learner: {cluster: slurm}\n")
    assert str(e.value.issues[0]).startswith("learner.cluster (line 1): Value error, must be \"local\", a scheduler")
    assert parse_spec("learner: {cluster: 'tcp://10.0.0.1:8786'}\n").learner.cluster == "tcp://10.0.0.1:8786"


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


# --- Runnable here: modules import, the data file reads -------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """An importable module `spec_user_mod` with an environment class and a filter."""
    (tmp_path / "spec_user_mod.py").write_text("class Env:\n    pass\ndef keep(group):\n    return True\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "spec_user_mod"
    sys.modules.pop("spec_user_mod", None)


def _issues(text, overrides=()):
    with pytest.raises(SpecError) as e:
        parse_spec(text, list(overrides))
    return [str(i) for i in e.value.issues]


def test_importable_entrypoint_filter_and_cluster_class_validate(user_module):
    spec = parse_spec(f"env: {{entrypoint: '{user_module}:Env'}}\n"
                      f"buffer: {{filters: [zero_variance, '{user_module}:keep']}}\n"
                      "actors: {cluster: 'distributed:LocalCluster'}\n"
                      "learner: {cluster: 'distributed:LocalCluster', cluster_kwargs: {resources: {learner: 1}}}\n")
    assert spec.buffer.filters == ("zero_variance", f"{user_module}:keep")


def test_entrypoint_that_does_not_import_is_reported_with_its_line():
    issues = _issues("name: x\nenv:\n  entrypoint: no_such_pkg_q3.envs:Env\n")
    assert len(issues) == 1
    assert issues[0].startswith("env.entrypoint (line 3): cannot import environment 'no_such_pkg_q3.envs:Env': "
                                "no module named 'no_such_pkg_q3'; check that it is installed or on PYTHONPATH")


def test_entrypoint_without_the_attribute_or_not_callable(user_module):
    assert _issues(f"env: {{entrypoint: '{user_module}:Nope'}}\n") == [
        (f"env.entrypoint (line 1): cannot load environment '{user_module}:Nope': "
         f"module '{user_module}' has no attribute 'Nope'")]
    assert _issues(f"env: {{entrypoint: '{user_module}:x'}}\n") == [
        f"env.entrypoint (line 1): '{user_module}:x' is a int, not a class or function"]


def test_filters_that_cannot_be_loaded_name_their_index():
    issues = _issues("buffer:\n  filters:\n    - zero_variance\n    - no_such_pkg_q3:keep\n    - bogus\n")
    assert issues[0].startswith("buffer.filters.1 (line 4): cannot import filter 'no_such_pkg_q3:keep'")
    assert issues[1] == ('buffer.filters.2 (line 5): unknown filter \'bogus\': use a built-in (zero_variance) '
                         'or "package.module:attribute"')


def test_cluster_class_that_cannot_be_loaded():
    # dask_jobqueue is not a dependency: naming its clusters without it installed is this error.
    name = "dask_jobqueue:SLURMCluster" if importlib.util.find_spec("dask_jobqueue") is None else "no_such_pkg_q3:C"
    issues = _issues(f"name: x\nactors:\n  cluster: '{name}'\n")
    assert len(issues) == 1 and issues[0].startswith(f"actors.cluster (line 3): cannot import cluster class '{name}'")
    assert _issues("name: x\n", [f"actors.cluster={name}"])[0].startswith("actors.cluster (--set): cannot import")
    issues = _issues(f"name: x\nlearner:\n  hosts: 2\n  cluster: '{name}'\n")
    assert len(issues) == 1 and issues[0].startswith(f"learner.cluster (line 4): cannot import cluster class '{name}'")


@pytest.mark.parametrize("content, message", [
    (None, r"cannot read .*p\.jsonl: No such file or directory"),
    (b"\n\n", r".*p\.jsonl holds no prompts"),
    (b'{"prompt": "a"}\n{"prompt": 1}\n', r'.*p\.jsonl line 2: expected \{"prompt": "..."\}'),
    (b'{"prompt": "a"}\n\n{"prompt": "\xff"}\n', r".*p\.jsonl line 3: not UTF-8"),
])
def test_data_source_that_cannot_be_read(tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    if content is not None:
        path.write_bytes(content)
    issues = _issues(f"name: x\ndata:\n  source: {path}\n")
    assert len(issues) == 1 and re.match(rf"data\.source \(line 3\): {message}", issues[0]), issues


def test_runnable_problems_come_with_the_other_errors():
    issues = _issues("env: {entrypoint: no_such_pkg_q3:Env}\nbuffer: {capacity: 0}\n")
    assert [i.split(":")[0] for i in issues] == ["buffer.capacity (line 2)", "env.entrypoint (line 1)"]


def test_data_source_is_stored_absolute(tmp_path, monkeypatch):
    """A run's spec.yaml reads the same data file from any directory (`tandem resume`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "p.jsonl").write_text('{"prompt": "secret=a"}\n')
    spec = parse_spec("name: x\ndata: {source: data/p.jsonl}\n")
    assert spec.data.source == "data/p.jsonl"  # the spec is what was written; only spec.yaml resolves it
    stored = tmp_path / "spec.yaml"
    stored.write_text(spec.to_yaml())
    assert yaml.safe_load(stored.read_text())["data"]["source"] == str(tmp_path / "data" / "p.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    resumed = load_spec(stored)
    assert resumed.data.source == str(tmp_path / "data" / "p.jsonl")
    assert resumed.to_yaml() == stored.read_text()  # a resumed run keeps its spec unchanged
    assert parse_spec("name: x\n").to_yaml().count("source: env") == 1


# --- Steps end on a published, checkpointed version ---------------------------------

@pytest.mark.parametrize("steps, interval, nearest", [(10, 4, "8 or 12"), (2, 4, "4"), (9, 2, "8 or 10")])
def test_steps_must_be_a_multiple_of_the_sync_interval(steps, interval, nearest):
    issues = _issues(f"learner:\n  steps: {steps}\nsync:\n  interval: {interval}\n")
    assert issues == [(f"learner.steps (line 2): must be a multiple of sync.interval ({interval}), or the last "
                       f"{steps % interval} step(s) would never be published or checkpointed; use {nearest}")]
    assert parse_spec(f"learner: {{steps: {steps - steps % interval or interval}}}\n"
                      f"sync: {{interval: {interval}}}\n")
    assert _issues("name: x\n", [f"learner.steps={steps}", f"sync.interval={interval}"])[0].startswith(
        "learner.steps (--set): must be a multiple")


# --- Bad input: encodings, characters, alias bombs ----------------------------------

def test_non_utf8_spec_file_is_a_spec_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: x\nenv:\n  kwargs: {word: café}\n".encode("latin-1"))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.source == str(path)
    assert [str(i) for i in e.value.issues] == [
        "<spec> (line 3): not UTF-8: byte 0xe9 at offset 33 cannot be decoded; save the spec as UTF-8"]


def test_character_yaml_forbids_names_its_line():
    assert _issues("name: x\nseed: \x01\n") == ["<spec> (line 2): not valid YAML: character #x0001 is not allowed"]


def _alias_bomb(levels=9):
    """A "billion laughs": each level repeats the previous one 9 times (9^levels strings)."""
    lines = ["name: bomb", "env:", "  kwargs:", "    a: &a [" + ", ".join(['"lol"'] * 9) + "]"]
    for prev, this in zip("abcdefgh", "bcdefghi"[: levels - 1]):
        lines.append(f"    {this}: &{this} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_at_the_alias_that_exceeds_the_budget():
    text = _alias_bomb()
    assert len(text) < 600
    issues = _issues(text)
    assert issues == [('<spec> (line 8): with this alias (*d), aliases repeat more than 10000 nodes in all: '
                       'refused as an alias bomb ("billion laughs"); write the values out, or share fewer')]
    bomb = ("{a: &a [1,1,1,1,1,1,1,1,1,1], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
            "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], d: [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]}")
    assert _issues("name: x\n", [f"env.kwargs={bomb}"])[0].startswith(
        "env.kwargs (--set): value: with this alias (*c), aliases repeat more than 10000 nodes")


def test_small_aliases_and_merge_keys_still_load():
    spec = parse_spec("env:\n  kwargs: {a: &a {x: [1, 2]}, b: *a, c: {<<: *a, y: 3}}\n")
    assert spec.env.kwargs == {"a": {"x": [1, 2]}, "b": {"x": [1, 2]}, "c": {"x": [1, 2], "y": 3}}


def test_recursive_alias_is_refused():
    assert _issues("name: x\nenv:\n  kwargs: &k {self: *k}\n") == [
        "<spec> (line 3): alias *k is inside the node it repeats: the spec would be infinite"]


def test_deep_nesting_is_a_spec_error():
    issues = _issues("env: {kwargs: {a: " + "[" * 5000 + "]" * 5000 + "}}\n")
    assert issues == ["<spec> (line 1): nested too deeply for a spec"]


# --- A version ends a batch -----------------------------------------------------------

def test_a_version_never_falls_mid_batch():
    """A checkpoint records its batch's groups as consumed: with 2 updates a batch and a
    version every step, one taken after the first update would skip the second on resume."""
    issues = _issues("learner:\n  steps: 8\n  minibatches: 2\nsync:\n  interval: 1\n")
    assert issues == [
        "sync.interval (line 5): must be a multiple of the steps a batch yields, learner.minibatches (line 3) "
        "× learner.epochs (default) = 2 × 1 = 2, or a version (and its checkpoint) would fall mid-batch, and a "
        "resume from it would skip the rest of that batch; use 2"]
    # An override is marked as such; the value proposed fits learner.steps too, or says how.
    issues = _issues("learner: {steps: 1000}\nsync: {interval: 1}\n", ["learner.epochs=3"])
    assert issues[0].startswith("sync.interval (line 2): must be a multiple of the steps a batch yields, "
                                "learner.minibatches (default) × learner.epochs (--set) = 1 × 3 = 3,")
    assert issues[0].endswith("; use 3, with learner.steps (line 1) a multiple of it: 999 or 1002")
    assert _issues("learner: {steps: 12, epochs: 4}\nsync: {interval: 6}\n")[0].endswith("; use 4")
    assert _issues("learner: {steps: 24, epochs: 4}\nsync: {interval: 6}\n")[0].endswith("; use 4 or 8")
    # A version every batch, or every few batches: fine.
    assert parse_spec("learner: {steps: 8, minibatches: 2}\nsync: {interval: 2}\n").sync.interval == 2
    assert parse_spec("learner: {steps: 8, minibatches: 2}\nsync: {interval: 4}\n").sync.interval == 4


# --- Inputs read with a bound ---------------------------------------------------------

def test_a_spec_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    with pytest.raises(SpecError) as e:
        load_spec("/dev/zero")  # read to its end, it never ends
    assert [str(i) for i in e.value.issues] == ["<spec> (spec): /dev/zero is not a regular file (a character device)"]
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    with pytest.raises(SpecError) as e:  # opened for reading, it waits for a writer forever
        _within(10, lambda: load_spec(fifo))
    assert [str(i) for i in e.value.issues] == [f"<spec> (spec): {fifo} is not a regular file (a FIFO)"]
    with pytest.raises(SpecError, match="is not a regular file"):
        load_spec(tmp_path)


def test_a_spec_file_larger_than_the_bound_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(2 * 2**20)  # sparse: 2 MiB of nothing
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert [str(i) for i in e.value.issues] == [
        f"<spec> (spec): {path} holds 2097152 bytes, more than a spec may (1 MiB)"]


def test_a_data_source_that_is_not_a_regular_file_or_too_large(tmp_path, monkeypatch):
    from tasks.buffer import prompts

    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)
    issues = _within(10, lambda: _issues(f"name: x\ndata:\n  source: {fifo}\n"))
    assert issues == [f"data.source (line 3): {fifo} is not a regular file (a FIFO)"]
    assert _issues("name: x\ndata:\n  source: /dev/zero\n") == [
        "data.source (line 3): /dev/zero is not a regular file (a character device)"]
    big = tmp_path / "big.jsonl"
    big.write_text('{"prompt": "a"}\n' * 100)
    monkeypatch.setattr(prompts, "MAX_DATA_BYTES", 1000)
    assert _issues(f"name: x\ndata:\n  source: {big}\n") == [
        f"data.source (line 3): {big} holds 1600 bytes, more than a data file may (1000 bytes)"]


def _within(seconds, call):
    """`call()`, failing the test if it has not returned within `seconds` (it may block)."""
    import threading

    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as e:  # re-raised in the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# --- Rows hold a batch ------------------------------------------------------------------

def test_rows_that_may_not_hold_a_batch_are_refused_with_a_value_that_fits():
    """The default spec's `rows: 48` with a user's longer contexts: every episode at
    max_len, one to a row of the largest bucket, needs a row each."""
    text = "model: {max_len: 128}\nlearner:\n  batch_groups: 16\n  buckets: [128]\n  rows: 48\n  minibatches: 3\n"
    assert _issues(text, ["learner.steps=201", "sync.interval=3"]) == [
        "learner.rows (line 5): 48 rows of the largest bucket, learner.buckets (line 4) = 128 tokens, may not hold "
        "a batch: learner.batch_groups (line 3) × actors.group_size (default) = 128 episodes of up to "
        "model.max_len (line 1) = 128 tokens, 1 to a row, need up to 128 rows; set learner.rows to 129 (or null: "
        "a row per episode), or raise the largest bucket"]
    # Four to a row of 64: 32 rows hold any batch of 128 episodes of up to 16 tokens.
    assert parse_spec("model: {max_len: 16}\nlearner: {batch_groups: 16, buckets: [32, 64], rows: 32}\n").learner.rows == 32
