"""Environments whose groups carry no learning signal, for the no-signal stop's tests.
Importable by Dask workers (PYTHONPATH=repo)."""

from tasks.actors.envs.guess_number import GuessNumber


class AlwaysLoses(GuessNumber):
    """Guess-number that no guess wins: every episode's reward is 0, so the entry filter
    drops every group (a policy collapsed onto wrong play, reached from the first step)."""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self._guesses += 1
        return "<", 0.0, True, {"success": False}


class AlwaysWins(GuessNumber):
    """Guess-number that every guess wins: a policy that has solved the game. Every group
    is filtered for all-alike rewards too, but the run reached its success target."""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self._guesses += 1
        return "=", 1.0, True, {"success": True}
