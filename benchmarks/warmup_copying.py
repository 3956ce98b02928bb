"""Does a warm-up teach the agent to copy? Teacher-forced accuracy on held-out demonstrations.

A spec's warm-up (its demonstrations, optimizer, batch and rows) is run from the spec's
`model.init` for `--updates` updates, and every `--every` the model is scored, teacher-forced,
on demonstrations it never trained on: the share of the agent's tokens it predicts right
(argmax), for the tokens that are numbers (copied: from the problem into the tool call,
from the result into the answer) and for the others (tags, framing), and the share of
demonstrations whose every agent token it predicts right (its greedy reply would be the
expert's). Nothing is written; the warm-up's own figures come from a `tandem run`.

    .venv/bin/python benchmarks/warmup_copying.py specs/word-problems.yaml --updates 100
    .venv/bin/python benchmarks/warmup_copying.py specs/word-problems.yaml --set model.init=models/random-25m
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--held-out", type=int, default=48, help="demonstrations scored (default 48)")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from flows.spec import load_spec
    from learner.batching import make_batch
    from learner.chat import make_tokenizer
    from learner.model import forward_fn
    from learner.sharding import make_mesh
    from learner.train import TrainStep, init_train_state
    from tasks.actors.envs import resolve_entrypoint
    from tasks.warmup.demonstrations import demonstrations, to_sample
    from tasks.warmup.stage import learner_config, order, warmup_batch

    spec = load_spec(args.spec, args.overrides)
    env_class = resolve_entrypoint(spec.env.entrypoint)
    tokenizer = make_tokenizer(spec.model)
    train = demonstrations(spec.warmup, env_class, spec.env.kwargs, spec.seed, set())
    scored_config = spec.warmup.model_copy(update={"examples": args.held_out})
    scored = demonstrations(scored_config, env_class, spec.env.kwargs, spec.seed + 10_000, set())
    train = [to_sample(d, tokenizer, spec.model.max_len, i) for i, d in enumerate(train)]
    scored = [to_sample(d, tokenizer, spec.model.max_len, i) for i, d in enumerate(scored)]
    trained = learner_config(spec)
    mesh = make_mesh(spec.learner.mesh)
    step_fn = TrainStep(spec.model, trained, mesh)
    state = init_train_state(spec.model, trained, seed=spec.seed, mesh=mesh)
    forward = jax.jit(forward_fn(spec.model))
    numbers = np.array([tokenizer.decode([i]).strip().isdigit() for i in range(spec.model.vocab_size)])
    rows = max(args.held_out, mesh.size)
    rows += -rows % mesh.size
    held = make_batch(scored, [1.0] * len(scored), spec.learner.buckets, rows)

    def score() -> str:
        logits = forward(state.params, jnp.asarray(held.tokens), jnp.asarray(held.positions),
                         jnp.asarray(held.segment_ids))
        right = np.asarray(jnp.argmax(logits, -1)) == held.targets
        mask, number = held.loss_mask > 0, numbers[held.targets]
        whole = [right[r][mask[r] & (held.segment_ids[r] == s)].all()
                 for r in range(right.shape[0]) for s in set(held.segment_ids[r][mask[r]].tolist())]
        return (f"numbers {right[mask & number].mean():.1%}, other tokens {right[mask & ~number].mean():.1%}, "
                f"whole replies {np.mean(whole):.1%}")

    optimizer = spec.warmup.optimizer
    decay = "constant" if optimizer.decay_steps is None else f"cosine over {optimizer.decay_steps}"
    schedule = f" (warm-up {optimizer.warmup_steps} updates, then {decay})" if optimizer.scheduled else ""
    print(f"{spec.model.init}: warm-up of {args.updates} updates of {spec.warmup.batch}, lr {optimizer.lr}"
          f"{schedule}, seed {spec.seed}; {len(scored)} held-out demonstrations; load {os.getloadavg()[0]:.1f}")
    started = time.perf_counter()
    for update in range(1, args.updates + 1):
        picked = order((update - 1) * spec.warmup.batch, len(train), spec.warmup.batch, spec.seed)
        state, values = step_fn(state, warmup_batch([train[i] for i in picked], spec))
        if update % args.every == 0 or update == args.updates:
            print(f"update {update}: nll {values['nll']:.3f}; {score()} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
