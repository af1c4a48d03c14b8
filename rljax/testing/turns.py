"""A scripted :class:`~rljax.engine.samples.Turns` for tests and research code: fixed env token
ids per turn, answered at once or whenever the caller resolves the turn's future.

``ScriptedTurns(script)`` answers turn ``k`` with ``script[k]`` and ends the conversation
(None) after the last. With ``manual=True`` each ``next_turn`` returns a pending future the
caller resolves with :meth:`ScriptedTurns.answer` (from any thread, or the test's own), so a
test arranges an env that is still working without sleeping.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence


class ScriptedTurns:
    """One conversation's scripted env: turn ``k``'s answer is ``script[k]`` (then None)."""

    def __init__(
        self, script: Sequence[Sequence[int]], *, manual: bool = False, reward: float = 1.0
    ):
        self.script = [list(ids) for ids in script]
        self.manual = manual
        self.turns_seen: list[list[int]] = []  # the model's tokens of each turn, as given
        self.pending: list[concurrent.futures.Future] = []  # manual futures not yet answered
        self._reward_per_turn = reward
        self._reward = 0.0

    def next_turn(self, turn_tokens: list[int]) -> concurrent.futures.Future[list[int] | None]:
        """The script's next answer (resolved now unless ``manual``)."""
        self.turns_seen.append(list(turn_tokens))
        self._reward += self._reward_per_turn
        future: concurrent.futures.Future[list[int] | None] = concurrent.futures.Future()
        if self.manual:
            self.pending.append(future)
        else:
            future.set_result(self._scripted())
        return future

    def answer(self) -> None:
        """Resolve the oldest pending future with the script's next answer."""
        if not self.pending:
            raise RuntimeError("no turn is waiting: the model has not ended a turn yet")
        self.pending.pop(0).set_result(self._scripted())

    def _scripted(self) -> list[int] | None:
        k = len(self.turns_seen) - 1
        return self.script[k] if k < len(self.script) else None

    @property
    def reward(self) -> float:
        """One ``reward`` per model turn ended."""
        return self._reward

    @property
    def info(self) -> dict:
        """The turns seen so far."""
        return {"turns": len(self.turns_seen)}


def scripted(
    script: Sequence[Sequence[int]], *, manual: bool = False
) -> tuple[Callable[[int], ScriptedTurns], dict[int, ScriptedTurns]]:
    """A ``Request.turns`` factory of ScriptedTurns (the same script for every sample), and
    the dict it fills with each sample's ScriptedTurns by sample index."""
    made: dict[int, ScriptedTurns] = {}

    def factory(index: int) -> ScriptedTurns:
        made[index] = ScriptedTurns(script, manual=manual)
        return made[index]

    return factory, made
