"""The warm-up: supervised fine-tuning on demonstrations before RL, in a task of its own
whose last checkpoint is the run's version 0."""
