"""Local Hugging Face checkpoints (Llama, Qwen2) as Tandem parameters, and back
(`save_params`: a trained version as a directory `transformers` loads; `save_new_model`: a
randomly initialised model of a named shape, `learner.shapes`); their config.json is read
by `learner.hf_config`.

A checkpoint directory holds `config.json`, one or more `*.safetensors` files and
usually `tokenizer.json`. Nothing is ever downloaded. HF stores a linear layer's
weight as [out, in] and Flax as [in, out], so every projection is transposed; the
rotary layout (rotate_half over the two halves of a head) is the same in both.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from learner.model import Params, init_params

if TYPE_CHECKING:
    from learner.config import ModelConfig
    from learner.shapes import Shape


def load_params(config: ModelConfig) -> Params:
    """The checkpoint at `config.init` as float32 NumPy params with `init_params`' structure.

    Raises:
      ValueError: a weight is missing or has the wrong shape for `config`.
    """
    weights = _read_safetensors(pathlib.Path(config.init))
    params = {
        "embed": {"embedding": weights.pop("model.embed_tokens.weight")},
        "final_norm": {"scale": weights.pop("model.norm.weight")},
        "blocks": {i: _block(weights, f"model.layers.{i}.", config.qkv_bias) for i in range(config.n_layers)},
    }
    if not config.tie_embeddings:
        params["lm_head"] = {"kernel": weights.pop("lm_head.weight").T}
    _check_shapes(params, config)
    return params


def _block(weights: dict[str, np.ndarray], prefix: str, qkv_bias: bool) -> dict[str, Any]:
    def linear(name: str, bias: bool = False) -> dict[str, np.ndarray]:
        layer = {"kernel": weights.pop(f"{prefix}{name}.weight").T}
        if bias:
            layer["bias"] = weights.pop(f"{prefix}{name}.bias")
        return layer

    return {
        "attn_norm": {"scale": weights.pop(f"{prefix}input_layernorm.weight")},
        "attn": {n: linear(f"self_attn.{n}_proj", qkv_bias) for n in "qkv"} | {"o": linear("self_attn.o_proj")},
        "mlp_norm": {"scale": weights.pop(f"{prefix}post_attention_layernorm.weight")},
        "mlp": {n: linear(f"mlp.{n}_proj") for n in ("gate", "up", "down")},
    }


def _read_safetensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"init: no *.safetensors files in {directory}")
    weights = {}
    for file in files:
        # The flax framework reads bfloat16, which NumPy alone cannot.
        with safe_open(file, framework="flax") as f:
            weights |= {name: np.asarray(f.get_tensor(name).astype(jnp.float32)) for name in f.keys()}
    return weights


def _check_shapes(params: Params, config: ModelConfig) -> None:
    expected = jax.eval_shape(lambda: init_params(config, 0))
    want = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(expected)}
    got = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}
    wrong = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    if wrong:
        raise ValueError(f"checkpoint {config.init} does not fit the model at {wrong[:5]}: "
                         f"expected {[want.get(k) for k in wrong[:5]]}, got {[got.get(k) for k in wrong[:5]]}")


# Files of a checkpoint directory that describe the model or its tokenizer, not its weights.
_COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "special_tokens_map.json", "chat_template.jinja")


def save_params(params: Params, config: ModelConfig, out: str | pathlib.Path) -> pathlib.Path:
    """Writes `params` as a Hugging Face directory: `model.safetensors` (float32, HF's names
    and [out, in] layout) beside the config and tokenizer files of `config.init`, the
    directory the model came from. The inverse of `load_params`.

    Raises:
      ValueError: the model did not come from a Hugging Face directory.
    """
    if config.init == "random":
        raise ValueError("model.init is random: only a model that came from a Hugging Face directory "
                         "is written as one (its config.json and tokenizer are copied from there)")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in _COPIED:
        if (pathlib.Path(config.init) / name).is_file():
            shutil.copyfile(pathlib.Path(config.init) / name, out / name)
    hf = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**hf, "torch_dtype": "float32"}, indent=2))
    save_file(_hf_weights(params, config), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def save_new_model(shape: Shape, out: str | pathlib.Path, *, tokenizer: str | pathlib.Path,
                   seed: int = 0, max_len: int = 4_096, copy_steps: int = 0, log=print) -> dict:
    """Writes a randomly initialised model of `shape` as a Hugging Face directory: config.json,
    generation_config.json, model.safetensors (float32) and the tokenizer files found in the
    directory `tokenizer` (`learner.bpe.train` writes them), whose end-of-turn token (its
    tokenizer_config.json's eos_token) ends generation. With `copy_steps`, the weights are
    first copy-pretrained (`learner.copying`) on the tokenizer's ordinary ids. Returns
    {"steps", "nll", "copied": the share of held-out copies right} after copy pretraining,
    also written to copying.json (which a directory of random weights has not), else {}.

    Raises:
      ValueError: no tokenizer files in `tokenizer`, or more ids than the shape's embedding rows.
    """
    from learner.config import ModelConfig
    from tokenizers import Tokenizer

    out, tokenizer = pathlib.Path(out), pathlib.Path(tokenizer)
    missing = [n for n in ("tokenizer.json", "tokenizer_config.json") if not (tokenizer / n).is_file()]
    if missing:
        raise ValueError(f"{tokenizer}: no {' or '.join(missing)} there")
    vocab = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    if vocab.get_vocab_size() > shape.vocab:
        raise ValueError(f"the tokenizer in {tokenizer} has {vocab.get_vocab_size()} ids; the shape has "
                         f"{shape.vocab} embedding rows")
    settings = json.loads((tokenizer / "tokenizer_config.json").read_text())
    stops = [vocab.token_to_id(settings["eos_token"])]
    if settings.get("pad_token"):
        stops.append(vocab.token_to_id(settings["pad_token"]))
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer.resolve() != out.resolve():
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tokenizer / name, out / name)
    hf = shape.hf_config(max_len=max_len, eos_token_id=stops[0], bos_token_id=None)
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": stops, "bos_token_id": None}, indent=2))
    config = ModelConfig(**shape.model_fields(), max_len=max_len)
    params = jax.jit(init_params, static_argnums=0)(config, seed)
    copying = {}
    if copy_steps:
        from learner.copying import copy_pretrain

        special = {token.content for token in vocab.get_added_tokens_decoder().values()}
        ids = np.array(sorted(i for t, i in vocab.get_vocab().items() if t not in special))
        params, copying = copy_pretrain(params, config, ids=ids, bos=stops[0], steps=copy_steps, seed=seed,
                                        log=log)
        copying = {"steps": copy_steps, **copying}
    (out / "copying.json").unlink(missing_ok=True)  # says how the weights were made: not so any more
    save_file(_hf_weights(params, config), str(out / "model.safetensors"), metadata={"format": "pt"})
    if copying:
        (out / "copying.json").write_text(json.dumps(copying, indent=2))
    return copying


def _hf_weights(params: Params, config: ModelConfig) -> dict[str, np.ndarray]:
    def array(x) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(x, np.float32))

    weights = {"model.embed_tokens.weight": array(params["embed"]["embedding"]),
               "model.norm.weight": array(params["final_norm"]["scale"])}
    if not config.tie_embeddings:
        weights["lm_head.weight"] = array(np.asarray(params["lm_head"]["kernel"]).T)
    for i in range(config.n_layers):
        block, prefix = params["blocks"][i], f"model.layers.{i}."
        weights[f"{prefix}input_layernorm.weight"] = array(block["attn_norm"]["scale"])
        weights[f"{prefix}post_attention_layernorm.weight"] = array(block["mlp_norm"]["scale"])
        layers = {f"self_attn.{n}_proj": block["attn"][n] for n in "qkvo"}
        layers |= {f"mlp.{n}_proj": block["mlp"][n] for n in ("gate", "up", "down")}
        for name, layer in layers.items():
            weights[f"{prefix}{name}.weight"] = array(np.asarray(layer["kernel"]).T)
            if "bias" in layer:
                weights[f"{prefix}{name}.bias"] = array(layer["bias"])
    return weights
