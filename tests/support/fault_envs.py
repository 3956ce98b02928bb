"""Environments that misbehave, for fault tests. Importable by Dask workers (PYTHONPATH=repo)."""

import time
from pathlib import Path

from tasks.actors.envs.guess_number import GuessNumber


class HangsOnce(GuessNumber):
    """Guess-number whose first episode of some prompts hangs in `step` for `hang_s`.

    Markers in `marker_dir` remember which prompts have hung, across processes.
    """

    def __init__(self, marker_dir: str, hang_s: float = 3.0, hanging: str = "ab", **kwargs):
        super().__init__(**kwargs)
        self.marker_dir, self.hang_s, self.hanging = Path(marker_dir), hang_s, hanging

    def reset(self, prompt: str) -> str:
        self._prompt = prompt
        return super().reset(prompt)

    def step(self, action: str):
        marker = self.marker_dir / self._prompt.replace("=", "-")
        if self._secret in self.hanging and not marker.exists():
            marker.touch()
            time.sleep(self.hang_s)
        return super().step(action)
