"""The experiment spec: one frozen pydantic tree, loaded from YAML with errors that
name the field path and the YAML line."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError, model_validator

from learner.config import Frozen, LearnerConfig, ModelConfig
from tasks.config import (
    ActorsConfig,
    BufferConfig,
    CheckpointConfig,
    DataConfig,
    EnvConfig,
    SyncConfig,
)


class Spec(Frozen):
    """A whole experiment; each part of Tandem receives the section it needs."""

    name: str = "tandem"
    seed: int = 0
    env: EnvConfig = EnvConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    actors: ActorsConfig = ActorsConfig()
    buffer: BufferConfig = BufferConfig()
    learner: LearnerConfig = LearnerConfig()
    sync: SyncConfig = SyncConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    @model_validator(mode="after")
    def _episodes_fit(self) -> "Spec":
        if self.learner.buckets[-1] < self.model.max_len:
            raise ValueError(
                f"learner.buckets: the largest bucket ({self.learner.buckets[-1]}) must hold "
                f"an episode of model.max_len ({self.model.max_len}) tokens"
            )
        return self

    @model_validator(mode="after")
    def _sync_mode_publishes_every_batch(self) -> "Spec":
        steps = self.learner.updates_per_batch
        if self.learner.mode == "sync" and self.sync.interval != steps:
            raise ValueError(
                f"sync.interval: learner.mode sync publishes once per batch, after its {steps} "
                f"step(s) (learner.minibatches × learner.epochs); set it to {steps}")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.checkpoint.dir or f"runs/{self.name}")

    def to_yaml(self) -> str:
        """The spec as resolved: every default filled in, the run directory absolute."""
        data = self.model_dump(mode="json")
        data["checkpoint"]["dir"] = str(self.run_dir.resolve())
        return yaml.safe_dump(data, sort_keys=False)


@dataclasses.dataclass(frozen=True)
class SpecIssue:
    path: str
    line: int | None  # 1-based YAML line; 0 for the whole file; None for a --set override
    message: str

    def __str__(self) -> str:
        if self.line is None:
            where = "--set"
        elif self.line == 0:  # the file as a whole (it cannot be read)
            where = "spec"
        else:
            where = f"line {self.line}"
        return f"{self.path or '<spec>'} ({where}): {self.message}"


class SpecError(ValueError):
    """Every problem of a spec, each with its field path and YAML line."""

    def __init__(self, source: str, issues: list[SpecIssue]):
        self.source, self.issues = source, issues
        super().__init__(f"{source}: invalid spec\n" + "\n".join(f"  {i}" for i in issues))


def load_spec(path: str | Path, overrides: list[str] = ()) -> Spec:
    """Reads, overrides (`path.to.field=yaml-value`) and validates a spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(str(path), [SpecIssue("", 0, f"cannot read: {e.strerror}")]) from None
    return parse_spec(text, overrides, source=str(path))


def parse_spec(text: str, overrides: list[str] = (), source: str = "<spec>") -> Spec:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        raise SpecError(source, [SpecIssue("", line, f"not valid YAML: {getattr(e, 'problem', e)}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(source, [SpecIssue("", 1, f"a spec is a mapping of sections, not a {type(data).__name__}")])
    overridden = [_apply_override(data, o, source) for o in overrides]
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, [_issue(err, node, overridden) for err in e.errors()]) from None


def _apply_override(data: dict, override: str, source: str) -> tuple[str, ...]:
    key, sep, raw = override.partition("=")
    keys = tuple(k for k in key.strip().split("."))
    if not sep or not all(keys):
        raise SpecError(source, [SpecIssue(key, None, f"--set expects path.to.field=value, got {override!r}")])
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise SpecError(source, [SpecIssue(key, None, f"value is not valid YAML: {e}")]) from None
    target = data
    for i, k in enumerate(keys[:-1]):
        target = target.setdefault(k, {})
        if not isinstance(target, dict):
            raise SpecError(source, [SpecIssue(".".join(keys[: i + 1]), None, "is not a section")])
    target[keys[-1]] = value
    return keys


def _issue(error: dict[str, Any], root: yaml.Node | None, overridden: list[tuple[str, ...]]) -> SpecIssue:
    loc = tuple(str(p) for p in error["loc"])
    message = error["msg"]
    # Checks across fields have no location of their own; they name their field first
    # (relative to the section they validate, or absolute from the root).
    named = re.match(r"Value error, ([\w.]+): (.*)", message, re.S)
    if named:
        loc, message = loc + tuple(named[1].split(".")), named[2]
    path = ".".join(loc)
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    if any(loc[: len(o)] == o for o in overridden):
        return SpecIssue(path, None, message)
    return SpecIssue(path, _line_of(root, loc), message)


def _line_of(node: yaml.Node | None, loc: tuple[str, ...]) -> int:
    """1-based line of the deepest YAML node on `loc` (the key itself for unknown keys)."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == part), None)
            if match is None:
                break
            key, node = match
            line = key.start_mark.line + 1
            if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
                line = node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
    return line
