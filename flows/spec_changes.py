"""What may change in a run's spec once the run exists (README, "Resuming a run").

A run directory's `spec.yaml` is its run's spec. `tandem run` on it takes no other spec
(`--fresh` starts anew); `tandem resume RUN --set ...` changes what neither its
checkpoints nor its ledger depend on (steps, stop rules, actors, buffer, eval, ...) and
refuses the rest (`FIXED`) before anything in the directory changes. Each accepted change
is kept in `spec.yaml` itself, as a comment above the spec: the run's history of changes.
"""

from __future__ import annotations

import datetime
import warnings
from typing import Any

import yaml

# What a checkpoint's arrays or the ledger's prompt cursor depend on. `name`: the run's
# lineage in Prefect is keyed by it. The optimizer's clipping, decay and learning-rate
# schedule (its update count), and a KL term (its reference copy of the weights), change the
# train state's structure. The warm-up made version 0: its data, length and optimizer are the run's.
FIXED = ("name", "seed", "model", "env.entrypoint", "env.kwargs", "data", "warmup", "actors.group_size",
         "learner.optimizer.max_grad_norm", "learner.optimizer.weight_decay", "learner.optimizer.warmup_steps",
         "learner.optimizer.decay_steps", "learner.loss.kl_coef")

HISTORY = "# changed "  # how a line of the history begins


def resolved(text: str) -> dict:
    """A run's `spec.yaml` as this version of Tandem resolves it: a field added since the
    run began reads as its default, not as a change (as the file read raw would)."""
    from flows.spec import RenamedField, SpecError, parse_spec

    try:
        # A field the run's spec.yaml names by an old name reads as the new one; the run's
        # own loading warned of it already, and this file is not one to fix here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RenamedField)
            return yaml.safe_load(parse_spec(text).to_yaml())
    except SpecError:  # no longer valid here: compared as written
        return yaml.safe_load(text)


def changes_from(spec_text: str, new_yaml: str) -> list[tuple[str, Any, Any]]:
    """What a spec (`Spec.to_yaml`) changes in the run whose `spec.yaml` reads `spec_text`."""
    return differences(resolved(spec_text), yaml.safe_load(new_yaml))


def differences(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(field path, old value, new value) of each leaf that differs between two resolved
    specs (`Spec.to_yaml`, parsed), in the specs' order; a leaf on one side only is None
    on the other."""
    out: list[tuple[str, Any, Any]] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in [*a, *(k for k in b if k not in a)]:
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            out.append((path, a, b))

    walk(old, new, "")
    return out


def fixed(changes: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """The changes a resumed run cannot take."""
    return [c for c in changes if any(c[0] == f or c[0].startswith(f + ".") for f in FIXED)]


def described(changes: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(f"  {path}: {yaml_value(a)} -> {yaml_value(b)}" for path, a, b in changes)


def with_history(previous_text: str, changes: list[tuple[str, Any, Any]], new_yaml: str) -> str:
    """The new `spec.yaml`: the previous one's history, a line for this change, the spec."""
    kept = [line for line in previous_text.splitlines() if line.startswith(HISTORY)]
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    kept.append(f"{HISTORY}{when}: " + "; ".join(f"{p} {yaml_value(a)} -> {yaml_value(b)}" for p, a, b in changes))
    return "\n".join(kept) + "\n" + new_yaml


def history(text: str) -> list[str]:
    """The accepted changes a `spec.yaml` records, oldest first."""
    return [line[len(HISTORY):] for line in text.splitlines() if line.startswith(HISTORY)]


def yaml_value(value: Any) -> str:
    """A field's value as `--set` takes it: YAML in one line (`[1, 2]`, `{a: 1}`, `null`)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()
