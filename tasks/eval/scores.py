"""The scores of an evaluation, from its groups: pure, so tests check them by hand."""

from __future__ import annotations

from learner.trajectory import Group, Sample


def succeeded(sample: Sample) -> bool:
    """The environment's `info["success"]`; without one, a positive reward."""
    return bool(sample.success) if sample.success is not None else sample.reward > 0


def score(groups: list[Group], k: int) -> dict:
    """Mean reward, success rate, pass@k and mean episode length, with their counts.

    Each prompt is one group of `k` episodes; an aborted group counts as k failed
    episodes of reward 0 (its reason is in its episodes' records). pass@k is the share of
    prompts with a success among their k episodes (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", with n = k samples). Lengths are in tokens and in
    actions (turns), over the episodes that finished.
    """
    episodes = len(groups) * k
    finished = [s for g in groups for s in g.samples]
    return {
        "prompts": len(groups),
        "episodes": episodes,
        "aborted": sum(g.aborted is not None for g in groups),
        "reward_mean": sum(s.reward for s in finished) / episodes if episodes else 0.0,
        "success_rate": sum(map(succeeded, finished)) / episodes if episodes else 0.0,
        f"pass_at_{k}": (sum(any(map(succeeded, g.samples)) for g in groups) / len(groups)) if groups else 0.0,
        "length_mean": sum(len(s) for s in finished) / len(finished) if finished else 0.0,
        "turns_mean": sum(_actions(s) for s in finished) / len(finished) if finished else 0.0,
    }


def _actions(sample: Sample) -> int:
    """Turns of the episode: runs of generated tokens."""
    generated = sample.generated
    return int(generated[0]) + int((generated[1:] & ~generated[:-1]).sum()) if len(generated) else 0
