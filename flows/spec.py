"""The experiment spec: one frozen pydantic tree, loaded from YAML with errors that
name the field path and the YAML line, and checked to be runnable from here (its
modules importable, its data file readable) before anything starts."""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from pydantic import ValidationError, model_validator

from learner.config import FieldError, Frozen, LearnerConfig, ModelConfig
from tasks.config import (
    ActorsConfig,
    BufferConfig,
    CheckpointConfig,
    DataConfig,
    EnvConfig,
    EpisodesConfig,
    EvalConfig,
    SyncConfig,
    WarmupConfig,
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
    eval: EvalConfig = EvalConfig()
    episodes: EpisodesConfig = EpisodesConfig()
    warmup: WarmupConfig | None = None  # supervised fine-tuning on demonstrations first (`tasks.warmup`)

    @model_validator(mode="after")
    def _episodes_fit(self) -> "Spec":
        if self.learner.buckets[-1] < self.model.max_len:
            raise FieldError(
                "learner.buckets", f"the largest bucket ({self.learner.buckets[-1]}) must hold "
                f"an episode of model.max_len ({self.model.max_len}) tokens"
            )
        return self

    @model_validator(mode="after")
    def _sync_mode_publishes_every_batch(self) -> "Spec":
        steps = self.learner.updates_per_batch
        if self.learner.mode == "sync" and self.sync.interval != steps:
            raise FieldError(
                "sync.interval", f"learner.mode sync publishes once per batch, after its {steps} "
                f"step(s) (learner.minibatches × learner.epochs); set it to {steps}")
        return self

    @model_validator(mode="after")
    def _versions_end_batches(self) -> "Spec":
        # A checkpoint records the groups of the batch being trained as consumed (README,
        # "Steps, batches and staleness"): one taken mid-batch would skip the rest of its
        # updates on resume. So a version, published every sync.interval steps, ends a batch.
        per_batch, interval = self.learner.updates_per_batch, self.sync.interval
        if interval % per_batch:
            raise AcrossFields(
                "sync.interval", "must be a multiple of the steps a batch yields, {0} × {1} = "
                f"{self.learner.minibatches} × {self.learner.epochs} = {per_batch}, or a version (and its "
                "checkpoint) would fall mid-batch, and a resume from it would skip the rest of that batch; "
                + _interval_that_fits(interval, per_batch, self.learner.steps),
                ("learner.minibatches", "learner.epochs", "learner.steps"))
        return self

    @model_validator(mode="after")
    def _last_step_is_published(self) -> "Spec":
        # Versions are published, and checkpointed, only every sync.interval steps: the
        # steps after the last multiple would be trained but never saved.
        steps, interval = self.learner.steps, self.sync.interval
        if steps % interval:
            below, above = steps - steps % interval, steps - steps % interval + interval
            nearest = f"{below} or {above}" if below else f"{above}"
            raise FieldError(
                "learner.steps", f"must be a multiple of sync.interval ({interval}), or the last "
                f"{steps % interval} step(s) would never be published or checkpointed; use {nearest}")
        return self

    @model_validator(mode="after")
    def _rows_split_over_hosts(self) -> "Spec":
        # Each host trains on its equal share of every minibatch's rows (`learner.multihost`).
        hosts, minibatches = self.learner.hosts, self.learner.minibatches
        rows = self.learner.batch_rows(self.learner.batch_groups * self.actors.group_size)
        if rows % (hosts * minibatches):
            raise FieldError(
                "learner.hosts", f"a batch's {rows} rows (learner.rows, or batch_groups × actors.group_size) "
                f"must split into learner.minibatches ({minibatches}) × hosts ({hosts}) equal parts")
        return self

    @model_validator(mode="after")
    def _rows_hold_a_batch(self) -> "Spec":
        # Packing never splits a sample, and any k samples of at most model.max_len tokens
        # fit a row of the largest bucket, k = bucket // max_len; so a batch of n samples
        # always fits ceil(n / k) rows, and may need them all (every episode at max_len).
        rows, bucket, max_len = self.learner.rows, self.learner.buckets[-1], self.model.max_len
        if rows is None or bucket < max_len:
            return self
        samples = self.learner.batch_groups * self.actors.group_size
        need = -(-samples // (bucket // max_len))
        if rows < need:
            parts = self.learner.minibatches * self.learner.hosts
            fits = -(-need // parts) * parts
            raise AcrossFields(
                "learner.rows", f"{rows} rows of the largest bucket, {{0}} = {bucket} tokens, may not hold a batch: "
                f"{{1}} × {{2}} = {samples} episodes of up to {{3}} = {max_len} tokens, {bucket // max_len} to a "
                f"row, need up to {need} rows; set learner.rows to {fits} (or null: a row per episode), or raise "
                "the largest bucket", ("learner.buckets", "learner.batch_groups", "actors.group_size", "model.max_len"))
        return self

    @model_validator(mode="after")
    def _warmup_on_one_local_host(self) -> "Spec":
        if self.warmup is not None and (self.learner.hosts > 1 or self.learner.cluster != "local"):
            raise FieldError("warmup", "a warm-up runs on this machine's devices: it needs learner.hosts 1 and "
                             "learner.cluster local (warm up apart, then point model.init at its export)")
        return self

    @model_validator(mode="after")
    def _eval_resources_need_workers_of_their_own(self) -> "Spec":
        # A local cluster's workers all carry actors.resources only, each held by its actor
        # for the session: an evaluation asking for resources would wait for good.
        if self.eval.resources and self.actors.cluster == "local":
            raise FieldError(
                "eval.resources", f"{self.eval.resources} need Dask workers started with them, which a local "
                "cluster does not have; set actors.cluster to a scheduler's address (and start `dask worker "
                "ADDRESS --resources NAME=N`), or leave eval.resources empty to evaluate beside the actors")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.checkpoint.dir or f"runs/{self.name}")

    def to_yaml(self) -> str:
        """The spec as resolved: every default filled in, the run directory and the data file
        absolute (so `tandem resume` from any directory finds the same ones)."""
        data = self.model_dump(mode="json")
        data["checkpoint"]["dir"] = str(self.run_dir.resolve())
        if self.data.source != "env":
            data["data"]["source"] = str(Path(self.data.source).resolve())
        return yaml.safe_dump(data, sort_keys=False)


class AcrossFields(FieldError):
    """A check across sections whose message names other fields than its own (`path`): the
    `fields` at `{0}`, `{1}`, ... of `template`, each shown with its YAML line (or --set,
    or default) where the spec came from YAML (`_issue`), by its path alone otherwise."""

    def __init__(self, path: str, template: str, fields: tuple[str, ...]):
        self.template, self.fields = template, fields
        super().__init__(path, self.render(lambda path: None))

    def render(self, where) -> str:
        """The message, each field followed by `where(field)` in parentheses, if not None."""
        named = [path if where(path) is None else f"{path} ({where(path)})" for path in self.fields]
        return self.template.format(*named)


def _interval_that_fits(interval: int, per_batch: int, steps: int) -> str:
    """What to set: the multiples of `per_batch` nearest `interval` that divide `steps`;
    else the nearest, with the `steps` that would fit it (`{2}`, in an `AcrossFields`
    template, is learner.steps)."""
    below = interval - interval % per_batch
    nearest = [n for n in (below, below + per_batch) if n]
    fits = [n for n in nearest if steps % n == 0]
    if fits:
        return "use " + " or ".join(map(str, fits))
    n = nearest[0]
    multiples = [m for m in (steps - steps % n, steps - steps % n + n) if m]
    return f"use {n}, with {{2}} a multiple of it: " + " or ".join(map(str, multiples))


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
    """Reads, overrides (`path.to.field=yaml-value`) and validates a spec file, then checks
    that it can run here (see `runnable_problems`)."""
    path = Path(path)
    return parse_spec(_decode(_read(path), str(path)), overrides, source=str(path))


# A spec is a few KiB: the bound only keeps a wrong path (a log, an image) from being read whole.
MAX_SPEC_BYTES = 2**20


def _read(path: Path) -> bytes:
    """The spec file's bytes: a regular file of at most MAX_SPEC_BYTES, else a SpecError."""
    from tasks.buffer.prompts import Unreadable, open_regular

    try:
        with open_regular(path, MAX_SPEC_BYTES, "a spec") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        message = f"cannot read: {e.strerror}"
    except Unreadable as e:  # not a regular file, or too large
        message = str(e)
    except ValueError as e:  # a name the OS cannot take (a NUL byte in it)
        message = f"cannot read: {e}"
    else:
        if len(raw) <= MAX_SPEC_BYTES:
            return raw
        message = f"{path} holds more than a spec may ({MAX_SPEC_BYTES // 2**20} MiB)"  # it grew since opened
    raise SpecError(str(path), [SpecIssue("", 0, message)])


def _decode(raw: bytes, source: str) -> str:
    try:
        return raw.decode("utf-8")  # YAML's encoding; not the locale's, which differs by machine
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SpecError(source, [SpecIssue("", line, (
            f"not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} cannot be decoded; "
            "save the spec as UTF-8"))]) from None


def parse_spec(text: str, overrides: list[str] = (), source: str = "<spec>") -> Spec:
    """Validates a spec's YAML text with its overrides, then checks that it can run here.

    Raises SpecError with every problem found, each with its field path and YAML line.
    """
    try:
        node, data = _load_yaml(text)
    except yaml.YAMLError as e:
        raise SpecError(source, [_yaml_issue(e, text)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(source, [SpecIssue("", 1, f"a spec is a mapping of sections, not a {type(data).__name__}")])
    # Field paths as validated (new names) -> as the YAML or a --set wrote them, to locate
    # and name an issue where its writer looks for it.
    written: dict[tuple[str, ...], tuple[str, ...]] = {}
    for old, new in _renamed_fields(data, (), lambda old, new: _both_names(
            source, old, _line_of(node, old), new, f"line {_line_of(node, new)}")):
        _warn_renamed(source, old, new, f"line {_line_of(node, old)}")
        written[new] = old
    overridden, written = _apply_overrides(data, overrides, source, written)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        # Every error at once: also what the sections that are valid on their own lack.
        raise SpecError(source, [_issue(err, node, overridden, written) for err in e.errors()]
                        + _runnable_issues(_valid_sections(data), node, overridden, written)) from None
    issues = _runnable_issues(spec, node, overridden, written)
    if issues:
        raise SpecError(source, issues)
    return spec


# --- Renamed fields ---------------------------------------------------------------------

# Fields renamed (old path: new path). A spec, or a --set, that still writes an old name is
# read as if it wrote the new one, with a RenamedField warning; one that writes both is
# refused. A rename is one line here (and the field's new name in its section's model).
RENAMED = {
    "actors.actors": "actors.groups_per_worker",  # beside actors.workers, it read as a count of actors
}
_RENAMES = [(tuple(old.split(".")), tuple(new.split("."))) for old, new in RENAMED.items()]  # as paths
_NEW_PATHS = {new for _, new in _RENAMES}


class RenamedField(FutureWarning):
    """A spec writes a field by its old name (`RENAMED`). A FutureWarning, as Python shows
    those to the users of a program by default: a spec's author is one."""


def _renamed_fields(data: dict, at: tuple[str, ...], both) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Moves each field of `RENAMED` that `data`, the mapping at path `at` of a spec, writes
    by its old name to its new one; returns the (old, new) paths moved. Where `data` writes
    both names, calls `both(old, new)`, which raises (`_both_names`)."""
    moved = []
    for old, new in _RENAMES:
        if old[: len(at)] != at or new[: len(at)] != at or len(old) == len(at):
            continue  # not inside `data` (a --set at or below an old name is renamed by its path)
        parent = _mapping_at(data, old[len(at):-1])
        if parent is None or old[-1] not in parent:
            continue
        target = _mapping_at(data, new[len(at):-1], create=True)
        if target is None:  # the new name's section is not a mapping: validation says so
            continue
        if new[-1] in target:
            both(old, new)
        target[new[-1]] = parent.pop(old[-1])
        moved.append((old, new))
    return moved


def _mapping_at(data: dict, keys: tuple[str, ...], create: bool = False) -> dict | None:
    """The mapping at `keys` under `data` (made where missing, if `create`); None if a value
    on the way is not a mapping."""
    for key in keys:
        if create and key not in data:
            data[key] = {}
        data = data.get(key)
        if not isinstance(data, dict):
            return None
    return data


def _renamed_path(keys: tuple[str, ...]) -> tuple[tuple[str, ...], list[tuple[tuple[str, ...], tuple[str, ...]]]]:
    """`keys` with an old name of `RENAMED` at its start replaced by the new, and [(old, new)]
    of that rename ([] where there is none)."""
    for old, new in _RENAMES:
        if keys[: len(old)] == old:
            return new + keys[len(old):], [(old, new)]
    return keys, []


def _both_names(source: str, old: tuple[str, ...], old_line: int | None, new: tuple[str, ...], new_where: str):
    """Raises the error of a spec that gives a renamed field by both its names."""
    raise SpecError(source, [SpecIssue(".".join(old), old_line, f"the old name of {'.'.join(new)} ({new_where}), "
                                       f"which the spec gives too; keep {'.'.join(new)} only")])


def _warn_renamed(source: str, old: tuple[str, ...], new: tuple[str, ...], where: str, depth: int = 1) -> None:
    """Warns of a spec that writes `old`; `depth`: the calls from parse_spec to here, so that
    the warning shows where parse_spec was called (under load_spec: in this module)."""
    warnings.warn(RenamedField(f"{source}: {'.'.join(old)} ({where}) is renamed {'.'.join(new)}; "
                               "the old name is read for now"), stacklevel=2 + depth)


# --- Overrides and where issues are ----------------------------------------------------


def _runnable_issues(spec: Spec | SimpleNamespace, root: yaml.Node | None, overridden: list[tuple[str, ...]],
                     written: dict[tuple[str, ...], tuple[str, ...]]) -> list[SpecIssue]:
    return [_located(tuple(path.split(".")), message, root, overridden, written)
            for path, message in runnable_problems(spec)]


def _apply_overrides(data: dict, overrides: list[str], source: str,
                     written: dict[tuple[str, ...], tuple[str, ...]]
                     ) -> tuple[list[tuple[str, ...]], dict[tuple[str, ...], tuple[str, ...]]]:
    """Applies the overrides in order; returns the paths they set, and `written` as they leave it."""
    overridden: list[tuple[str, ...]] = []
    set_as: dict[tuple[str, ...], tuple[str, ...]] = {}  # a renamed field -> the name a --set gave it
    for override in overrides:
        keys, renames = _apply_override(data, override, source)
        # An override replaces what it sets, whichever name the YAML gave it: a run's
        # spec.yaml, written under an old name, takes a --set by the new one.
        written = {new: old for new, old in written.items() if new[: len(keys)] != keys}
        names = {keys: keys} if keys in _NEW_PATHS else {}
        for old, new in renames:
            _warn_renamed(source, old, new, "--set", depth=2)
            written[new] = names[new] = old
        for new, name in names.items():
            if set_as.setdefault(new, name) != name:  # two --set give it, one by each name
                old = name if name != new else set_as[new]
                _both_names(source, old, None, new, "--set")
        overridden.append(keys)
    return overridden, written


def _apply_override(data: dict, override: str, source: str
                    ) -> tuple[tuple[str, ...], list[tuple[tuple[str, ...], tuple[str, ...]]]]:
    """Sets `data` at the override's path (by its new name, if it writes an old one); returns
    that path and the (old, new) paths of the renamed fields it wrote."""
    key, sep, raw = override.partition("=")
    keys = tuple(k for k in key.strip().split("."))
    if not sep or not all(keys):
        raise SpecError(source, [SpecIssue(key, None, f"--set expects path.to.field=value, got {override!r}")])
    try:
        _, value = _load_yaml(raw)
    except yaml.YAMLError as e:
        message = _yaml_issue(e, raw).message
        raise SpecError(source, [SpecIssue(key, None, f"value: {message}")]) from None
    keys, renames = _renamed_path(keys)
    if isinstance(value, dict):  # a section (or more) given whole: the fields inside it too
        renames += _renamed_fields(value, keys, lambda old, new: _both_names(source, old, None, new, "--set"))
    target = data
    for i, k in enumerate(keys[:-1]):
        target = target.setdefault(k, {})
        if not isinstance(target, dict):
            raise SpecError(source, [SpecIssue(".".join(keys[: i + 1]), None, "is not a section")])
    target[keys[-1]] = value
    return keys, renames


def _issue(error: dict[str, Any], root: yaml.Node | None, overridden: list[tuple[str, ...]],
           written: dict[tuple[str, ...], tuple[str, ...]]) -> SpecIssue:
    loc = tuple(str(p) for p in error["loc"])
    message = error["msg"]
    raised = error.get("ctx", {}).get("error")
    # A check of a model's fields has no location of its own: it names its field.
    if isinstance(raised, FieldError):
        loc, message = loc + tuple(raised.path.split(".")), raised.message
    if isinstance(raised, AcrossFields):  # the other fields it names, located too
        message = raised.render(lambda path: _where(tuple(path.split(".")), root, overridden, written))
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    return _located(loc, message, root, overridden, written)


def _as_written(loc: tuple[str, ...], written: dict[tuple[str, ...], tuple[str, ...]]) -> tuple[str, ...]:
    """Field path `loc` as the spec or its --set wrote it: by a renamed field's old name there."""
    for new, old in written.items():
        if loc[: len(new)] == new:
            return old + loc[len(new):]
    return loc


def _located(loc: tuple[str, ...], message: str, root: yaml.Node | None,
             overridden: list[tuple[str, ...]], written: dict[tuple[str, ...], tuple[str, ...]]) -> SpecIssue:
    """The issue at field `loc`: on its YAML line, or marked --set if an override set it."""
    path = ".".join(_as_written(loc, written))
    if any(loc[: len(o)] == o for o in overridden):
        return SpecIssue(path, None, message)
    return SpecIssue(path, _line_of(root, _as_written(loc, written)), message)


def _where(loc: tuple[str, ...], root: yaml.Node | None, overridden: list[tuple[str, ...]],
           written: dict[tuple[str, ...], tuple[str, ...]]) -> str:
    """Where field `loc` got its value: "--set", "line N" of the YAML, or "default"."""
    if any(loc[: len(o)] == o for o in overridden):
        return "--set"
    loc = _as_written(loc, written)
    node = root
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            return "default"
        node = next((v for k, v in node.value if str(k.value) == part), None)
        if node is None:
            return "default"
    return f"line {_line_of(root, loc)}"


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


# --- YAML reading ----------------------------------------------------------------------

# Aliases may repeat at most this many nodes in all. Far more than any spec shares, far
# less than a "billion laughs" bomb: ~600 bytes of nested aliases that expand to 10^9
# nodes when the spec is written out to the run's spec.yaml (or compared, or sent).
MAX_ALIAS_NODES = 10_000


class _Refused(yaml.YAMLError):
    """YAML that parses but that a spec must not be: an alias bomb or a cycle."""

    def __init__(self, message: str, mark: yaml.Mark):
        super().__init__(message)
        self.message, self.mark = message, mark


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that charges every alias the nodes it expands to, within a budget."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its size with aliases expanded

    def compose_node(self, parent, index):
        if not self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)
        # A mapping or sequence gets its end mark once all its children are composed:
        # without one, the alias is inside the very node it names.
        if node.end_mark is None:
            raise _Refused(f"alias *{self._anchor_of(node)} is inside the node it repeats: "
                           "the spec would be infinite", mark)
        self._alias_nodes += _expanded_size(node, self._sizes)
        if self._alias_nodes > MAX_ALIAS_NODES:
            raise _Refused(f"with this alias (*{self._anchor_of(node)}), aliases repeat more than "
                           f"{MAX_ALIAS_NODES} nodes in all: refused as an alias bomb (\"billion "
                           "laughs\"); write the values out, or share fewer", mark)
        return node

    def _anchor_of(self, node: yaml.Node) -> str:
        return next((a for a, n in self.anchors.items() if n is node), "?")


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Nodes under `node`, itself included, every alias counted as a copy (memoised, so
    linear in the document even when the expansion is astronomic)."""
    if id(node) not in sizes:
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = []
        sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[id(node)]


def _load_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for lines) and its data, parsed once."""
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    except RecursionError:  # the composer recurses once per nesting level
        raise _Refused("nested too deeply for a spec", loader.get_mark()) from None
    finally:
        loader.dispose()


def _yaml_issue(error: yaml.YAMLError, text: str) -> SpecIssue:
    """The issue of YAML that cannot be loaded, on the line where the problem is."""
    if isinstance(error, _Refused):
        return SpecIssue("", error.mark.line + 1, error.message)
    if isinstance(error, yaml.reader.ReaderError):  # a character YAML does not allow
        line = text.count("\n", 0, error.position) + 1
        return SpecIssue("", line, f"not valid YAML: character #x{error.character:04x} is not allowed")
    mark = getattr(error, "problem_mark", None)
    line = mark.line + 1 if mark else 0
    return SpecIssue("", line, f"not valid YAML: {getattr(error, 'problem', error)}")


# --- Can it run here? -------------------------------------------------------------------


def runnable_problems(spec: Spec | SimpleNamespace) -> list[tuple[str, str]]:
    """What a spec still needs in order to run from here, as (field path, message): its
    environment, filters and cluster class importable, its data file readable.

    Pydantic checks the spec's shape; this checks the world around it (sys.path, files),
    so the spec itself stays a pure value. The loaders are the ones the run uses. `spec`
    may also be `_valid_sections(data)`: the sections that are None are not checked.
    """
    from tasks.actors.envs import resolve_entrypoint
    from tasks.buffer.filters import resolve_filter

    problems = []
    if spec.env is not None:
        problems += _loadable("env.entrypoint", spec.env.entrypoint, resolve_entrypoint)
    for i, name in enumerate(spec.buffer.filters if spec.buffer is not None else ()):
        problems += _loadable(f"buffer.filters.{i}", name, resolve_filter)
    problems += _cluster_classes(spec)
    if spec.data is not None and spec.data.source != "env":
        from tasks.buffer.prompts import read_jsonl  # the reader the run uses

        problems += _failing("data.source", lambda: read_jsonl(Path(spec.data.source)))
    if isinstance(spec, Spec) and spec.eval.every is not None and not problems:
        try:
            _training_draws_outside_eval(spec)
        except FieldError as e:  # eval.prompts, eval.n or data.source
            problems.append((e.path, e.message))
        except ValueError as e:
            problems.append(("eval", str(e)))
    return problems


def _cluster_classes(spec: Spec | SimpleNamespace) -> list[tuple[str, str]]:
    """[(path, message)] for each cluster class the spec names (actors' or learner's) that
    does not load: a field that is neither "local" nor an address is one, as the run reads it."""
    problems = []
    for section in ("actors", "learner"):
        cluster = getattr(spec, section).cluster if getattr(spec, section) is not None else "local"
        if cluster != "local" and "://" not in cluster:
            from tasks.placement import cluster_class  # imports distributed: only when needed

            path = f"{section}.cluster"
            problems += _loadable(path, cluster, functools.partial(cluster_class, field=path))
    return problems


def _training_draws_outside_eval(spec) -> None:
    """Raises ValueError (naming its field) unless the eval's prompts read and training can
    still draw prompts once they are held out (`tasks.eval.prompts`)."""
    from tasks.actors.envs import resolve_entrypoint
    from tasks.buffer.prompts import PromptSource
    from tasks.eval.prompts import held_out

    env_class = resolve_entrypoint(spec.env.entrypoint)
    source = PromptSource(spec.data, env_class, spec.env.kwargs, spec.seed,
                          held_out=held_out(spec.eval, env_class, spec.env.kwargs))
    source.next()


def _valid_sections(data: dict) -> SimpleNamespace:
    """The sections `runnable_problems` reads, each validated alone; None where invalid."""
    sections = {}
    for name in ("env", "data", "actors", "buffer", "learner", "eval"):
        try:
            sections[name] = Spec.model_fields[name].annotation.model_validate(data.get(name, {}))
        except ValidationError:
            sections[name] = None
    return SimpleNamespace(**sections)


def _loadable(path: str, name: str, load) -> list[tuple[str, str]]:
    """[(path, message)] if `load(name)` fails or gives something that cannot be called."""
    try:
        loaded = load(name)
    except ValueError as e:
        return [(path, _message(e, path))]
    if not callable(loaded):
        return [(path, f"{name!r} is a {type(loaded).__name__}, not a class or function")]
    return []


def _failing(path: str, check) -> list[tuple[str, str]]:
    """[(path, message)] if `check()` raises ValueError, else []."""
    try:
        check()
    except ValueError as e:
        return [(path, _message(e, path))]
    return []


def _message(error: ValueError, path: str) -> str:
    """`error`'s message in the issue at `path`, which names that field already."""
    return error.message if isinstance(error, FieldError) and error.path == path else str(error)
