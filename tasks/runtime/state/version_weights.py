"""The weights of a run's version after the fact (`tandem eval`, `tandem export`): from its
checkpoint, or else from the copy its evaluation kept (`tasks.eval.results`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from learner import multihost
from learner.serialization import params_from_bytes
from learner.sharding import make_mesh
from learner.train import abstract_train_state, params_numpy
from tasks.eval.results import read_scores, weights_path
from tasks.run_dir import RunDir
from tasks.runtime.state.checkpoints import Checkpoints


def available_versions(run_dir: Path) -> list[int]:
    """Versions whose weights are in the run directory."""
    versions = set(RunDir(run_dir).versions())
    if RunDir(run_dir).warmed_up() is not None:
        versions.add(0)  # the warm-up's weights
    versions |= {int(p.stem[1:]) for p in weights_path(run_dir, 0).parent.glob("v*.safetensors")}
    return sorted(versions)


def version_weights(spec, version: int) -> tuple[Any, int, Path | None]:
    """(host NumPy params, step, the version's checkpoint or None) of `spec`'s run.

    Raises ValueError if the run directory holds neither.
    """
    run_dir = RunDir(spec.run_dir.resolve())
    if version in run_dir.versions():
        checkpoints = Checkpoints(run_dir.checkpoints, keep=None)
        try:
            abstract = abstract_train_state(spec.model, spec.learner, make_mesh(spec.learner.mesh))
            state, record = checkpoints.restore(version, abstract)
        finally:
            checkpoints.close()
        return params_numpy(state), record["step"], checkpoints.path(version)
    if version == 0 and (warmed := run_dir.warmed_up()) is not None:
        from tasks.warmup.stage import warmed_params

        return multihost.host_numpy(warmed_params(spec, make_mesh(spec.learner.mesh))), 0, warmed
    kept = weights_path(run_dir.path, version)
    # The evaluation that kept them recorded the version's step (from its checkpoint) first.
    step = next((s["step"] for s in read_scores(run_dir.path) if s["version"] == version), None)
    if kept.is_file() and step is not None:
        return params_from_bytes(kept.read_bytes()), step, None
    raise ValueError(f"version {version}: no checkpoint and no kept weights in {run_dir.path} "
                     f"(versions there: {available_versions(run_dir.path) or 'none'})")
