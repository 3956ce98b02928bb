"""A version's weights after the fact: from the copy its evaluation kept when it has no
checkpoint (what `tandem export --version best` reads then)."""

import jax
import numpy as np
import pytest

from flows.export import export_command
from flows.spec import parse_spec
from learner.model import init_params
from learner.serialization import params_to_bytes
from tasks.eval.results import record_eval
from tasks.runtime.state.version_weights import available_versions, version_weights

OUTCOME = {"scores": {"prompts": 1, "episodes": 1, "success_rate": 1.0, "reward_mean": 1.0}, "episodes": []}


def test_weights_kept_by_an_evaluation_are_read_back(tmp_path, capsys):
    spec = parse_spec(f"checkpoint: {{dir: {tmp_path}}}\nmodel: {{d_model: 16, d_ff: 32}}\n")
    params = jax.device_get(init_params(spec.model, 0))
    record_eval(tmp_path, version=7, step=28, checkpoint=None, outcome=OUTCOME, params_bytes=params_to_bytes(params))
    assert available_versions(tmp_path) == [7]
    read, step, checkpoint = version_weights(spec, 7)
    assert (step, checkpoint) == (28, None)
    jax.tree.map(np.testing.assert_array_equal, read, params)
    with pytest.raises(ValueError, match="version 8: no checkpoint and no kept weights"):
        version_weights(spec, 8)
    # A randomly initialised model has no Hugging Face directory to be written as.
    assert export_command(spec, "best", tmp_path / "out") == 1
    assert "model.init is random" in capsys.readouterr().err
