"""Environments that misbehave, for fault tests. Importable by Dask workers (PYTHONPATH=repo)."""

import contextlib
import threading
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


class OneSessionEach:
    """A stateful tool (a shell, a browser): each instance is one session, which must serve
    one episode at a time.

    Every call is logged in `OneSessionEach.log` as [instance, call, prompt, start, end]
    (monotonic seconds; end None while it runs), `close` included. `step` of a prompt that
    starts with "hang" blocks until `OneSessionEach.release` is set (at most `hang_s`, so
    that no test leaves a thread behind for long); other prompts end in one step. The log
    and the event are class attributes, shared by every instance an actor builds: tests
    reset them (`OneSessionEach.fresh()`).
    """

    log: list = []
    release = threading.Event()

    def __init__(self, hang_s: float = 30.0):
        self.hang_s = hang_s
        self.prompt = None

    @classmethod
    def fresh(cls) -> None:
        cls.log, cls.release = [], threading.Event()

    def reset(self, prompt: str) -> str:
        self.prompt = prompt
        with self._call("reset"):
            return ":"

    def step(self, action: str):
        with self._call("step"):
            if self.prompt.startswith("hang"):
                self.release.wait(self.hang_s)
            return ":", 1.0, True, {"success": True}

    def close(self) -> None:
        with self._call("close"):
            pass

    @contextlib.contextmanager
    def _call(self, name: str):
        record = [self, name, self.prompt, time.monotonic(), None]
        self.log.append(record)
        try:
            yield
        finally:
            record[4] = time.monotonic()
