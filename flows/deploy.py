"""The deployments' entrypoint (`prefect.yaml`): the training flow, given its spec as a
deployment parameter.

Deployment parameters are JSON, so `spec` is one of
- a path to a spec file, relative to the worker's working directory (the checkout
  `prefect deploy` ran in), e.g. `specs/guess-number.yaml`;
- YAML text (a string with a newline, or starting with `{`);
- a mapping of sections, as typed into the UI's JSON editor;
and `overrides` are `path.to.field=value` strings, as `tandem run --set` takes them.
The spec is validated like `tandem validate`: a bad one fails the flow run with every
error's field path and line (for a mapping, the line of the spec dumped as YAML, keys in
the order given).
"""

from __future__ import annotations

from typing import Any

import yaml
from prefect import flow

from flows.spec import Spec, load_spec, parse_spec
from flows.train import train


@flow(name="tandem-train", log_prints=True)
def train_spec(spec: str | dict[str, Any], overrides: list[str] | None = None) -> dict:
    """Trains the spec's agent (see `flows.train.train`); `spec` is a path, YAML or a mapping."""
    # The body of `train` runs inside this flow run, so a deployment run is the training
    # run itself (its tasks, versions and artifacts), not a parent of one.
    return train.fn(resolve_spec(spec, overrides or []))


def resolve_spec(spec: str | dict[str, Any], overrides: list[str]) -> Spec:
    """Validates a `spec` parameter; raises `flows.spec.SpecError`."""
    if isinstance(spec, dict):
        return parse_spec(yaml.safe_dump(spec, sort_keys=False), overrides, source="spec parameter (as YAML)")
    if "\n" in spec or spec.lstrip().startswith("{"):
        return parse_spec(spec, overrides, source="spec parameter")
    return load_spec(spec, overrides)
