"""The README's worked example runs as written."""

import asyncio
import os
import re
import subprocess
import sys

import jax

from flows.spec import parse_spec
from learner.model import init_params
from tasks.actors.envs import resolve_entrypoint
from tasks.actors.generation import local_generation
from tasks.actors.rollout import GroupRunner
from tests.conftest import ROOT


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_worked_example_environment_plays_a_group(tmp_path, monkeypatch):
    code = next(b for b in blocks("python") if "class Parity" in b)
    spec_text = next(b for b in blocks("yaml") if "name: parity" in b)
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "parity.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = parse_spec(spec_text)
    env_class = resolve_entrypoint(spec.env.entrypoint)
    prompt = env_class(**spec.env.kwargs).task(__import__("random").Random(0))
    with local_generation(spec.model, spec.actors, jax.device_get(init_params(spec.model, 0))) as service:
        runner = GroupRunner.build(service, spec.env, spec.actors, spec.model)
        group = asyncio.run(runner.run(0, prompt, 0, [env_class(**spec.env.kwargs) for _ in range(4)]))
    assert group.aborted is None and len(group.samples) == 4
    assert all(s.success is not None for s in group.samples)
    sys.modules.pop("my_envs.parity", None)
    sys.modules.pop("my_envs", None)


def test_worked_example_validates_as_the_readme_says_to_run_it(tmp_path):
    """The files saved where their first lines say, the README's own command, from their directory."""
    code = next(b for b in blocks("python") if "class Parity" in b)
    spec_text = next(b for b in blocks("yaml") if "name: parity" in b)
    command = next(line for b in blocks("bash") for line in b.splitlines() if "tandem validate specs/parity" in line)
    for text in (code, spec_text):
        path = tmp_path / text.splitlines()[0].removeprefix("# ").split()[0]
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    command = command.split("#")[0].replace(".venv/bin/tandem", str(ROOT / ".venv" / "bin" / "tandem"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("specs/parity.yaml: ok (parity"), result.stdout
