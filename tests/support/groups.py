"""Groups and intake rules for tests, without actors: what the buffer would hand the learner."""

import numpy as np

from learner.config import ModelConfig, TokenizerConfig
from learner.trajectory import OBSERVATION, Group, Sample
from tasks.actors.envs.guess_number import GuessNumber
from tasks.buffer.intake import IntakeRules, Pace
from tasks.buffer.ledger import Ledger
from tasks.buffer.prompts import PromptSource
from tasks.config import BufferConfig, DataConfig

TINY_MODEL = ModelConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=16,
                         tokenizer=TokenizerConfig(alphabet="ab"))


def make_group(prompt_id: int, rewards=(0.0, 1.0), *, version: int = 0, attempt: int = 0, length: int = 6,
               success=None) -> Group:
    """A group of one sample per reward: observation and generated tokens alternating, the
    generated ones made at `version`."""
    versions = np.where(np.arange(length) % 2 == 1, version, OBSERVATION).astype(np.int32)
    tokens = (3 + np.arange(length) % 2).astype(np.int32)  # within TINY_MODEL's vocabulary
    samples = tuple(Sample(tokens, np.full(length, -0.7, np.float32), versions, float(r),
                           None if success is None else bool(r > 0)) for r in rewards)
    return Group(prompt_id, f"prompt {prompt_id}", samples, 0.0, 0.0, attempt=attempt)


def make_rules(n_actors: int = 1, *, batch_groups: int = 2, sync_interval: int = 1, outstanding: int = 100,
               ledger: Ledger | None = None, observers=(), **buffer) -> IntakeRules:
    source = PromptSource(DataConfig(), GuessNumber, {}, seed=0)
    pace = Pace(batch_groups=batch_groups, sync_interval=sync_interval, outstanding=outstanding)
    return IntakeRules(BufferConfig(**buffer), ledger or Ledger(), source, pace, n_actors, log=lambda _: None,
                       observers=observers)
