"""`tandem validate | run | resume` on specs that cannot run: exit 2, each problem with its
field path and line, before anything starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows import cli
from flows.cli import main
from flows.spec import load_spec

GOOD = "name: x\nlearner:\n  steps: 8\nsync:\n  interval: 4\n"


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """`run` and `resume` get as far as training, never into it: what they would train is kept."""
    started = []
    monkeypatch.setattr(cli, "_run", lambda spec: started.append(spec) or 0)
    return started


def write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


def test_validate_ok(tmp_path, capsys):
    assert main(["validate", write(tmp_path, GOOD)]) == 0
    assert capsys.readouterr().out.endswith(": ok (x, run directory runs/x)\n")


@pytest.mark.parametrize("text, expected", [
    ("name: x\nenv:\n  entrypoint: no_such_pkg_q4.envs:Env\n",
     "env.entrypoint (line 3): cannot import environment 'no_such_pkg_q4.envs:Env': no module named 'no_such_pkg_q4'"),
    ("name: x\nenv:\n  entrypoint: tasks.actors.envs:Nope\n",
     ("env.entrypoint (line 3): cannot load environment 'tasks.actors.envs:Nope': "
      "module 'tasks.actors.envs' has no attribute 'Nope'")),
    ("name: x\nbuffer:\n  filters: [zero_variance, no_such_pkg_q4:keep]\n",
     "buffer.filters.1 (line 3): cannot import filter 'no_such_pkg_q4:keep'"),
    ("name: x\nactors:\n  cluster: no_such_pkg_q4:SLURMCluster\n",
     "actors.cluster (line 3): cannot import cluster class 'no_such_pkg_q4:SLURMCluster'"),
    ("name: x\ndata:\n  source: /no/such/prompts.jsonl\n",
     "data.source (line 3): cannot read /no/such/prompts.jsonl: No such file or directory"),
    ("name: x\nlearner:\n  steps: 10\n",
     ("learner.steps (line 3): must be a multiple of sync.interval (4), or the last 2 step(s) would never be "
      "published or checkpointed; use 8 or 12")),
])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_spec_that_cannot_run_exits_2_naming_field_and_line(tmp_path, capsys, no_training, command, text, expected):
    path = write(tmp_path, text)
    assert main([command, path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: invalid spec\n") and f"  {expected}" in err, err
    assert not no_training


def test_data_file_without_valid_prompts(tmp_path, capsys):
    data = write(tmp_path, b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n', "p.jsonl")
    assert main(["validate", write(tmp_path, f"name: x\ndata:\n  source: {data}\n")]) == 2
    assert (f"data.source (line 3): {data} line 2: not UTF-8 (byte 0xe9 at offset 15 of the line)"
            in capsys.readouterr().err)


def test_non_utf8_spec(tmp_path, capsys):
    path = write(tmp_path, "name: café\n".encode("latin-1"))
    assert main(["validate", path]) == 2
    assert capsys.readouterr().err == (
        f"{path}: invalid spec\n  <spec> (line 1): not UTF-8: byte 0xe9 at offset 9 cannot be decoded; "
        "save the spec as UTF-8\n")


ALIAS_BOMB = "name: bomb\nenv:\n  kwargs:\n    a: &a [" + ", ".join(['"lol"'] * 9) + "]\n" + "".join(
    f"    {this}: &{this} [" + ", ".join([f"*{prev}"] * 9) + "]\n" for prev, this in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("command", ["validate", "run"])
def test_alias_bomb_is_refused_before_it_expands(tmp_path, capsys, no_training, command):
    assert len(ALIAS_BOMB) < 600
    assert main([command, write(tmp_path, ALIAS_BOMB)]) == 2
    assert "<spec> (line 8): with this alias (*d), aliases repeat more than 10000 nodes" in capsys.readouterr().err
    assert not no_training


def test_resume_checks_the_run_spec(tmp_path, capsys, no_training):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write(run_dir, "name: x\nenv:\n  entrypoint: no_such_pkg_q4:Env\n")
    assert main(["resume", str(run_dir)]) == 2
    assert "env.entrypoint (line 3): cannot import environment" in capsys.readouterr().err
    assert not no_training


def test_resume_from_another_directory_reads_the_same_data_file(tmp_path, monkeypatch, no_training):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "secret=a"}\n')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.yaml").write_text(load_spec(write(tmp_path, GOOD + "data:\n  source: p.jsonl\n")).to_yaml())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["resume", str(run_dir)]) == 0
    assert no_training[0].data.source == str(tmp_path / "p.jsonl")


def test_console_script_reports_without_a_traceback(tmp_path):
    tandem = Path(sys.executable).parent / "tandem"
    for text in (ALIAS_BOMB.encode(), "name: café\n".encode("latin-1")):
        result = subprocess.run([str(tandem), "validate", write(tmp_path, text)], capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert "(line " in result.stderr


def test_a_learner_failure_reaches_the_terminal_without_its_wrapping():
    """The learner task's error names the learner; the terminal says "run failed:" already."""
    import pickle
    from types import SimpleNamespace

    from flows.cli import failure
    from tasks.runtime.session.failures import LearnerFailed, LearnerFailedUnrecoverably, Unrecoverable

    error = pickle.loads(pickle.dumps(LearnerFailedUnrecoverably("NoProgress: no progress is possible")))
    assert isinstance(error, Unrecoverable) and str(error) == "learner failed: NoProgress: no progress is possible"
    state = SimpleNamespace(result=lambda raise_on_failure: error, message="Flow run failed")
    assert failure(state) == "NoProgress: no progress is possible"
    other = SimpleNamespace(result=lambda raise_on_failure: RuntimeError("disk on fire"), message="")
    assert failure(other) == "disk on fire"
    assert isinstance(LearnerFailed("x"), RuntimeError)


def test_new_model_writes_a_checkpoint_a_spec_loads(tmp_path, capsys):
    from learner import bpe
    from learner.config import ModelConfig

    bpe.train(tmp_path / "tok", vocab_size=1_000, corpus_bytes=100_000)
    assert main(["new-model", "llama-25m", str(tmp_path / "m"), "--tokenizer", str(tmp_path / "tok"),
                 "--max-len", "512"]) == 0
    assert "llama-25m (24.6M parameters, context 512) written to" in capsys.readouterr().out
    config = ModelConfig(init=str(tmp_path / "m"), max_len=256)
    assert (config.d_model, config.n_layers, config.vocab_size, config.tie_embeddings) == (256, 8, 32_768, False)
    assert config.tokenizer.kind == "hf"
    assert not (tmp_path / "m" / "copying.json").exists()  # random weights, as made
    assert main(["new-model", "llama-25m", str(tmp_path / "m"), "--tokenizer", str(tmp_path / "m"),
                 "--max-len", "512", "--copy-steps", "2"]) == 0  # copy-pretrained in place, its tokenizer kept
    copying = json.loads((tmp_path / "m" / "copying.json").read_text())
    assert copying["steps"] == 2 and 0 <= copying["copied"] <= 1 and copying["nll"] > 0
    assert "copy pretraining: 2 updates; held-out copies right" in capsys.readouterr().out
    assert main(["new-model", "llama-25m", str(tmp_path / "n"), "--tokenizer", str(tmp_path / "missing")]) == 1
    assert "missing" in capsys.readouterr().err
