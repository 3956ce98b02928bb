"""A local Hugging Face checkpoint's config.json read as `ModelConfig` fields.

Plain JSON, no arrays: the spec validates `model.init` with it (`learner.config`), before
any model module is imported; `learner.hf` reads the weights.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

SUPPORTED = ("llama", "qwen2")


def read_config(path: str | pathlib.Path) -> dict[str, Any]:
    """The checkpoint's config.json, after checking it is an architecture Tandem implements.

    Raises:
      ValueError: no config.json, or a model type or feature the Flax model lacks.
    """
    file = pathlib.Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"init: {path} is neither 'random' nor a checkpoint directory with a config.json")
    hf = json.loads(file.read_text())
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    unsupported = {
        "model_type": hf.get("model_type") not in SUPPORTED,
        "hidden_act": hf.get("hidden_act", "silu") != "silu",
        "head_dim": hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
        != hf["hidden_size"] // hf["num_attention_heads"],
        "rope_type": rope.get("rope_type", rope.get("type", "default")) != "default",
        "mlp_bias": bool(hf.get("mlp_bias")),
        "use_sliding_window": bool(hf.get("use_sliding_window")),
    }
    bad = [f"{key}={hf.get(key, rope.get(key))!r}" for key, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ValueError(f"init: checkpoint {path} is not a plain {' or '.join(SUPPORTED)} model ({', '.join(bad)})")
    return hf


def checkpoint_fields(path: str, given: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields for a checkpoint: its sizes, overlaid with the ones `given`.

    Args:
      path: the checkpoint directory (`model.init`).
      given: the fields the spec sets; sizes among them must equal the checkpoint's.

    Returns:
      `given` with the architecture fields filled in and, when the directory has a
      tokenizer.json and no tokenizer is given, an "hf" tokenizer over it.
    """
    hf = read_config(path)
    rope = hf.get("rope_parameters") or {}
    sizes = {
        "d_model": hf["hidden_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_heads": hf["num_attention_heads"],
        "n_kv_heads": hf.get("num_key_value_heads") or hf["num_attention_heads"],
        "d_ff": hf["intermediate_size"],
        "vocab": hf["vocab_size"],
        "rope_theta": rope.get("rope_theta", hf.get("rope_theta", 10_000.0)),
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "tie_embeddings": hf.get("tie_word_embeddings", False),
        "qkv_bias": hf["model_type"] == "qwen2" or bool(hf.get("attention_bias")),
    }
    for name, value in sizes.items():
        if name in given and given[name] != value:
            raise ValueError(f"{name}: {given[name]!r} disagrees with the checkpoint's {value!r} ({path})")
    fields = {**given, **sizes}
    if "tokenizer" not in given and (pathlib.Path(path) / "tokenizer.json").is_file():
        fields["tokenizer"] = {"kind": "hf", "path": path}
    return fields
