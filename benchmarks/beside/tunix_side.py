"""Tunix beside Tandem: Google Tunix's own sampler and GRPO learner step, timed on a Hugging Face
model directory, one JSON line per measurement on stdout (Tunix's logs go to stderr).

Run with Tunix's venv (`make tunix-venv`), never the product's; this imports nothing from Tandem:

    .venv-tunix/bin/python benchmarks/beside/tunix_side.py --model DIR --part decode \\
        --slots 8 --context 512 --new-tokens 32 --repeats 3
    .venv-tunix/bin/python benchmarks/beside/tunix_side.py --model DIR --part learner \\
        --rows 2 --length 512 --steps 3
    .venv/bin/python benchmarks/beside/hf_reference.py --model DIR --out /tmp/ref.npz
    .venv-tunix/bin/python benchmarks/beside/tunix_side.py --model DIR --check /tmp/ref.npz

Model. DIR's config.json (model_type "qwen2" or "llama") is written into Tunix's
`tunix.models.{qwen2,llama3}.model.ModelConfig`, and that family's
`params.create_model_from_safe_tensors` loads model.safetensors in float32. What config.json says
that Tunix's config cannot express (rope scaling, Llama's attention or MLP biases, ...) is listed
under "not_expressed" in every line. Everything runs inside a one-device ("fsdp", "tp") mesh made
by `tunix.utils.mesh.create_mesh`, entered as `RLCluster` enters its roles' meshes (`with mesh:`,
which `PeftTrainer` reads): without one, the trainer leaves the optimizer state uncommitted and
its step compiles twice.

decode. `tunix.generate.sampler.Sampler` with `CacheConfig(cache_size=P+N)` generates for B prompts
of P random token ids (eos and pad left out). The sampler takes strings; its tokenizer here is a
stand-in whose `encode` parses space-separated ids and adds no bos, so each prompt is exactly the
P ids drawn and no text tokenization is timed. Sampling: temperature 1, top_p 1 (Tunix then draws
with `jax.random.categorical` over the whole vocabulary), eos and pad given as `forbidden_tokens`
so every row generates N tokens. t1 is a call with max_generation_steps=1 and tN one with N, each
compiled by a first call before `--repeats` timed calls of each, interleaved: prefill tokens/s =
B*P / median(t1), decode tokens/s = B*(N-1) / (median(tN) - median(t1)) (null if not positive,
as when other work lands on one of the calls). Tunix's decode loop runs while
decoding_step < P+N, one step past the last kept token, so t1 is a prefill plus one decode step
and tN a prefill plus N: their difference is N-1 decode steps.

learner. One GRPO gradient step as `GRPOLearner` runs it, on a fixed batch, without its rollout:
`tunix.rl.trainer.Trainer` (a `PeftTrainer`) over the model with `optax.adam`, its loss set as
`GRPOLearner.__init__` sets it (the "grpo" policy loss, `algo_core.grpo_loss_fn`, with
`GRPOConfig`'s defaults, pad and eos ids), and its own jitted step from
`jit_train_and_eval_step()`: `nnx.value_and_grad` of that loss, `optax.global_norm`,
`optimizer.update`, under `nnx.jit` with the optimizer donated. Its input is a `TrainExample` of
R rows: prompt L/4 and completion 3L/4 random ids (all unmasked), random advantages, and old and
reference log-probs computed once beforehand by `common.compute_per_token_logps` (what the rollout
would supply). Not timed: the loop of `PeftTrainer.train` around the step (metrics, checkpoint
manager, progress bar), which needs a data iterator and times nothing per step.

check. Tunix's logits for the reference ids (full forward, no cache) against transformers' logits
from `hf_reference.py`, and the Tunix sampler's greedy continuation against transformers' greedy
one (eos and pad masked in both).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.llama3 import model as llama3_model
from tunix.models.llama3 import params as llama3_params
from tunix.models.qwen2 import model as qwen2_model
from tunix.models.qwen2 import params as qwen2_params
from tunix.rl import common, function_registry
from tunix.rl import trainer as rl_trainer
from tunix.rl.grpo import grpo_learner
from tunix.sft import peft_trainer, sharding_utils
from tunix.utils import mesh as mesh_lib

from decode_timing import peak_rss_gb

# model_type -> (Tunix model module, its params module, the ModelConfig field for tied embeddings)
FAMILIES = {
    "qwen2": (qwen2_model, qwen2_params, "use_tied_embedding"),
    "llama": (llama3_model, llama3_params, "weight_tying"),
}


class IdTokenizer:
    """The sampler's tokenizer: text is space-separated token ids; no bos."""

    def __init__(self, eos: int, pad: int):
        self._eos, self._pad = eos, pad

    def encode(self, text: str, **_) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **_) -> str:
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return None

    def eos_id(self) -> int:
        return self._eos

    def pad_id(self) -> int:
        return self._pad


# ---------------------------------------------------------------- the model

def rope_theta(hf: dict) -> float:
    theta = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta") or 10_000.0
    return int(theta) if float(theta).is_integer() else float(theta)


def not_expressed(hf: dict) -> list[str]:
    """What config.json sets that Tunix's ModelConfig for this family cannot say."""
    family, out = hf["model_type"], []
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        out.append(f"rope scaling '{kind}': Tunix's {family} rope is plain")
    if hf.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act {hf['hidden_act']}: Tunix's MLP is SiLU-gated")
    if family == "llama" and hf.get("attention_bias"):
        out.append("attention_bias: Tunix's llama3 has no q/k/v/o biases (they are not loaded)")
    if family == "llama" and hf.get("mlp_bias"):
        out.append("mlp_bias: Tunix's llama3 MLP has no biases (they are not loaded)")
    if family == "qwen2" and hf.get("use_sliding_window"):
        out.append("use_sliding_window: Tunix's qwen2 attends to the whole context")
    return out


def model_config(hf: dict):
    model_lib, _, tie_field = FAMILIES[hf["model_type"]]
    heads = hf["num_attention_heads"]
    fields = {
        "num_layers": hf["num_hidden_layers"], "vocab_size": hf["vocab_size"],
        "embed_dim": hf["hidden_size"], "hidden_dim": hf["intermediate_size"],
        "num_heads": heads, "head_dim": hf.get("head_dim") or hf["hidden_size"] // heads,
        "num_kv_heads": hf.get("num_key_value_heads") or heads,
        "rope_theta": rope_theta(hf), "norm_eps": hf["rms_norm_eps"],
        tie_field: bool(hf.get("tie_word_embeddings", False)),
    }
    return model_lib.ModelConfig(**fields), fields


def one_device_mesh() -> jax.sharding.Mesh:
    """The mesh a Tunix RL cluster runs each role in (`ClusterConfig.role_to_mesh`), one device,
    made as Tunix's CLI makes it (`tunix.utils.mesh.create_mesh`: Auto axes)."""
    return mesh_lib.create_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1])


def read_hf_config(model_dir: Path) -> dict:
    """config.json, with eos/pad from generation_config.json where config.json has none."""
    hf = json.loads((model_dir / "config.json").read_text())
    gen = model_dir / "generation_config.json"
    extra = json.loads(gen.read_text()) if gen.exists() else {}
    for key in ("eos_token_id", "pad_token_id"):
        if hf.get(key) is None and extra.get(key) is not None:
            hf[key] = extra[key]
    if hf.get("eos_token_id") is None:
        raise SystemExit(f"{model_dir}: no eos_token_id in config.json or generation_config.json")
    return hf


def load_model(model_dir: Path, mesh: jax.sharding.Mesh):
    hf = read_hf_config(model_dir)
    if hf.get("model_type") not in FAMILIES:
        raise SystemExit(f"model_type {hf.get('model_type')!r}: only {sorted(FAMILIES)}")
    config, fields = model_config(hf)
    params = FAMILIES[hf["model_type"]][1]
    model = params.create_model_from_safe_tensors(str(model_dir), config, mesh=mesh, dtype=jnp.float32)
    return model, hf, fields


def special_ids(hf: dict) -> tuple[int, int, list[int]]:
    """eos (the first, if several), pad (eos if none), and every id a random prompt avoids."""
    eos = hf.get("eos_token_id")
    eos_ids = list(eos) if isinstance(eos, list) else [eos]
    pad = hf.get("pad_token_id")
    pad = eos_ids[0] if pad is None else pad
    return eos_ids[0], pad, sorted(set(eos_ids) | {pad})


def random_ids(vocab: int, shape: tuple[int, int], avoid: list[int], seed: int) -> np.ndarray:
    """As hf_reference.py draws them: uniform ids, a special id moved to a neighbour."""
    ids = np.random.default_rng(seed).integers(0, vocab, size=shape)
    for bad in avoid:
        ids[ids == bad] = (bad + 1) % vocab if (bad + 1) % vocab not in avoid else (bad - 1) % vocab
    return ids.astype(np.int32)


# ---------------------------------------------------------------- measuring

XLA_COMPILES = [0]  # backend compilations so far, counted through jax.monitoring
jax.monitoring.register_event_duration_secs_listener(
    lambda event, _secs, **_: XLA_COMPILES.__setitem__(0, XLA_COMPILES[0] + (
        event == "/jax/core/compile/backend_compile_duration")))


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return time.perf_counter() - start, out


def emit(args, hf: dict, fields: dict, record: dict) -> None:
    line = {"system": "tunix", "tunix_version": importlib.metadata.version("google-tunix"),
            "jax_version": jax.__version__, "device": jax.devices()[0].device_kind,
            "model": args.model.name, "model_type": hf["model_type"], "tunix_config": fields,
            "not_expressed": not_expressed(hf), **record,
            "loadavg_1m": round(os.getloadavg()[0], 2)}  # others' work on the machine, at the end
    print(json.dumps(line), flush=True)


def make_sampler(model, hf: dict, cache_size: int) -> sampler_lib.Sampler:
    eos, pad, _ = special_ids(hf)
    cfg = model.config
    cache = sampler_lib.CacheConfig(cache_size=cache_size, num_layers=cfg.num_layers,
                                    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
    return sampler_lib.Sampler(model, IdTokenizer(eos, pad), cache)


def decode_part(args, model, hf: dict) -> dict:
    b, p, n = args.slots, args.context, args.new_tokens
    avoid = special_ids(hf)[2]
    sampler = make_sampler(model, hf, cache_size=p + n)
    prompts = [" ".join(map(str, row)) for row in random_ids(hf["vocab_size"], (b, p), avoid, seed=0)]

    def call(steps: int):
        return sampler(prompts, max_generation_steps=steps, max_prompt_length=p, temperature=1.0,
                       top_p=1.0, forbidden_tokens=avoid, seed=0)

    first_1, _ = timed(call, 1)
    first_n, out = timed(call, n)
    compiles = XLA_COMPILES[0]
    pairs = [(timed(call, 1)[0], timed(call, n)[0]) for _ in range(args.repeats)]  # interleaved
    compiles = XLA_COMPILES[0] - compiles
    t1, tn = [a for a, _ in pairs], [b for _, b in pairs]
    m1, mn = statistics.median(t1), statistics.median(tn)
    cfg, itemsize = model.config, jnp.dtype(sampler.dtype).itemsize
    kv_shape = [b, p + n, cfg.num_kv_heads, cfg.head_dim]
    return {
        "part": "decode", "slots": b, "context": p, "new_tokens": n, "repeats": args.repeats,
        "first_calls_s": {"1": round(first_1, 3), str(n): round(first_n, 3)},
        "t1_s": [round(t, 4) for t in t1], "tN_s": [round(t, 4) for t in tn],
        "prefill_s": round(m1, 4), "generate_s": round(mn, 4),
        "compiles_in_timed_calls": compiles,
        "prefill_tokens_per_s": round(b * p / m1, 1),
        "decode_tokens_per_s": round(b * (n - 1) / (mn - m1), 1) if mn > m1 else None,
        "generated_per_row": sorted({len(t) for t in out.tokens}),
        "cache_size": p + n, "kv_cache_shape_per_layer": kv_shape,
        "kv_cache_dtype": str(jnp.dtype(sampler.dtype)),
        "kv_cache_bytes": 2 * cfg.num_layers * int(np.prod(kv_shape)) * itemsize,
        # Tunix's prefill computes logits at every prompt position unless the model takes
        # decode_only_last_token (qwen2 and llama3 in 0.1.7 do not): B*P*vocab of them.
        "prefill_logits_all_positions": not sampler._supports_decode_only_last_token,
        "peak_rss_gb": peak_rss_gb(),
        "how": "tunix.generate.sampler.Sampler.__call__ on token-id prompts (id tokenizer, no bos), "
               "temperature 1, top_p 1, eos/pad forbidden; t1 = max_generation_steps 1, tN = N; "
               "medians of interleaved timed calls after one compiling call each",
    }


def train_example(model, hf: dict, rows: int, length: int, beta: float):
    """A TrainExample as GRPOLearner assembles it, from random ids instead of a rollout."""
    eos, pad, avoid = special_ids(hf)
    ids = jnp.asarray(random_ids(hf["vocab_size"], (rows, length), avoid, seed=2))
    prompt, completion = ids[:, : length // 4], ids[:, length // 4:]
    graphdef, state = nnx.split(model)
    logps_fn = jax.jit(lambda s, p, c: common.compute_per_token_logps(
        graphdef, s, prompt_tokens=p, completion_tokens=c, pad_id=pad, eos_id=eos, stop_gradient=True))
    logps = logps_fn(state, prompt, completion)
    return grpo_learner.TrainExample(
        prompt_ids=prompt, prompt_mask=prompt != pad,
        completion_ids=completion, completion_mask=completion != pad,
        advantages=jax.random.normal(jax.random.key(3), (rows,), jnp.float32),
        ref_per_token_logps=logps if beta else None, old_per_token_logps=logps)


def grpo_train_step(model, hf: dict, algo_config, lr: float):
    """The PeftTrainer step GRPOLearner trains with: its loss wiring, its jit."""
    eos, pad, _ = special_ids(hf)
    trainer = rl_trainer.Trainer(model, optax.adam(lr),
                                 peft_trainer.TrainingConfig(eval_every_n_steps=10**9),
                                 custom_checkpoint_metadata_fn=dict)
    policy_loss_fn = function_registry.get_policy_loss_fn(algo_config.policy_loss_fn)
    trainer.with_loss_fn(lambda model, train_example, algo_config: policy_loss_fn(
        model, train_example, algo_config=algo_config, pad_id=pad, eos_id=eos), has_aux=True)
    trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo_config})
    return trainer.jit_train_and_eval_step(cache_nnx_graph=True)[0]


def learner_part(args, model, hf: dict) -> dict:
    algo_config = grpo_learner.GRPOConfig(beta=args.beta)
    algo_config.temperature = 1.0  # GRPOLearner copies it from the rollout config
    example = train_example(model, hf, args.rows, args.length, args.beta)
    step = grpo_train_step(model, hf, algo_config, args.lr)
    example = sharding_utils.shard_input(example, ("fsdp",))  # as PeftTrainer.train does
    first, _ = timed(step, example)
    times, losses, compiles = [], [], XLA_COMPILES[0]
    for _ in range(args.steps):
        t, (loss, _, _) = timed(step, example)
        times.append(t)
        losses.append(float(loss))
    compiles = XLA_COMPILES[0] - compiles
    step_s = statistics.median(times)
    return {
        "part": "learner", "rows": args.rows, "length": args.length,
        "prompt_tokens": args.length // 4, "completion_tokens": args.length - args.length // 4,
        "steps": args.steps, "beta": args.beta, "optimizer": f"optax.adam({args.lr})",
        "first_calls_s": round(first, 3), "step_s": [round(t, 4) for t in times],
        "median_step_s": round(step_s, 4),
        "tokens_per_s": round(args.rows * args.length / step_s, 1),
        "loss": losses, "peak_rss_gb": peak_rss_gb(),
        "compiles_in_timed_calls": compiles,
        "how": "tunix.rl.trainer.Trainer.jit_train_and_eval_step() (PeftTrainer._train_step under "
               "nnx.jit: nnx.value_and_grad of algo_core.grpo_loss_fn wired as GRPOLearner wires "
               "it, optimizer.update) on one fixed TrainExample; old/ref log-probs precomputed; "
               "no rollout, no PeftTrainer.train loop",
    }


def check_part(args, model, hf: dict) -> dict:
    ref = np.load(args.check)
    ids, eos_ids = ref["ids"], [int(i) for i in ref["eos_ids"]]
    rows, t = ids.shape
    positions = jnp.broadcast_to(jnp.arange(t), (rows, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (rows, t, t))
    logits, _ = model(jnp.asarray(ids), positions, None, mask)
    diff = float(np.max(np.abs(np.asarray(logits) - ref["logits"])))
    g = ref["greedy"].shape[1]
    out = make_sampler(model, hf, cache_size=t + g)(
        [" ".join(map(str, row)) for row in ids], max_generation_steps=g, max_prompt_length=t,
        forbidden_tokens=eos_ids)
    greedy = np.stack([np.asarray(x) for x in out.tokens])
    return {
        "part": "check", "reference": str(args.check), "ids_shape": [rows, t],
        "logits_max_abs_diff": diff, "logits_max_abs": float(np.max(np.abs(ref["logits"]))),
        "atol": args.atol, "logits_ok": diff <= args.atol,
        "greedy_tokens_match": bool(np.array_equal(greedy, ref["greedy"])),
        "how": "Tunix model forward (no cache, causal mask) vs transformers logits; "
               "Sampler greedy (eos/pad forbidden) vs transformers argmax loop",
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face model directory")
    parser.add_argument("--part", choices=["decode", "learner"])
    parser.add_argument("--check", type=Path, help="hf_reference.py's .npz: compare logits with it")
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--slots", type=int, default=8, help="decode: prompts per call (B)")
    parser.add_argument("--context", type=int, default=512, help="decode: prompt tokens (P)")
    parser.add_argument("--new-tokens", type=int, default=32, help="decode: tokens generated (N)")
    parser.add_argument("--repeats", type=int, default=3, help="decode: timed calls of each kind")
    parser.add_argument("--rows", type=int, default=2, help="learner: rows (R)")
    parser.add_argument("--length", type=int, default=512, help="learner: tokens per row (L)")
    parser.add_argument("--steps", type=int, default=3, help="learner: timed steps")
    parser.add_argument("--beta", type=float, default=grpo_learner.GRPOConfig.beta,
                        help="learner: KL coefficient (Tunix's GRPOConfig default)")
    parser.add_argument("--lr", type=float, default=1e-6, help="learner: adam's learning rate")
    args = parser.parse_args()
    if not (args.part or args.check):
        parser.error("give --part, --check, or both")
    if args.part == "decode" and args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (decode tok/s compares N with 1)")
    return args


def main() -> None:
    args = parse_args()
    parts = ([check_part] if args.check else []) + (
        [{"decode": decode_part, "learner": learner_part}[args.part]] if args.part else [])
    mesh = one_device_mesh()
    with mesh:  # as RLCluster runs its roles: PeftTrainer and the model's shard() read this mesh
        model, hf, fields = load_model(args.model, mesh)
        for part in parts:
            emit(args, hf, fields, part(args, model, hf))


if __name__ == "__main__":
    main()
