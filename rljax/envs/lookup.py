"""The env of ``data.task='arithmetic_lookup'``: a problem whose second operand is hidden.

The prompt is the problem with the operand hidden (``'37+*='``). A turn that is just the hidden
mark (``'*'``) calls the lookup tool, which answers with the operand and an equals sign
(``'45='``, a tool message); any other turn is the answer, scored by the run's reward and
ending the conversation. The model cannot do better than guess without the tool, so what it
learns comes from what the env returns. ``blind=True`` is the control: the tool answers nothing
(an empty tool message), so calling it cannot help.
"""

from __future__ import annotations

from collections.abc import Callable

from rljax.envs.base import Step


class LookupEnv:
    """One arithmetic_lookup conversation (module docstring)."""

    def __init__(self, reward: Callable[[str, dict], float], *, blind: bool = False):
        from rljax.data.arithmetic import HIDDEN  # rljax.data's package loads JAX; rljax.envs not

        self.hidden_mark = HIDDEN
        self.reward = reward
        self.blind = blind
        self.example: dict = {}

    def reset(self, example: dict) -> list[dict]:
        if "hidden" not in example:
            raise ValueError(
                "LookupEnv needs data.task='arithmetic_lookup' examples (with a 'hidden' "
                "operand); set data.task or use another env"
            )
        self.example = example
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, action: str) -> Step:
        if action.strip() == self.hidden_mark:
            content = "" if self.blind else f"{self.example['hidden']}="
            return Step([{"role": "tool", "content": content}], info={"tool_calls": 1})
        return Step(reward=float(self.reward(action, self.example)), done=True)
