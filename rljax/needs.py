"""What a registry entry needs of the rest of the run config.

A registry (teachers, tasks, losses) declares, next to each name, the config values the entry
only works with: the teacher ``calls_calculator_sometimes`` needs ``env.name='tools'``. The run
config checks every chosen entry's needs with one rule (``rljax.config.checks.check_needs``),
so a pairing is written once, where the entry is. Import-light: no rljax module, no JAX, so
that the config and the registries can both import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Needs:
    """The config values an entry works with: ``values`` maps a dotted config key to the one
    value it must hold; ``why`` says, in a few words, what breaks otherwise."""

    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    why: str = ""

    def unmet(self, value_of: Callable[[str], Any]) -> list[str]:
        """The keys whose value (``value_of(key)``) is not the one needed. A key that
        ``value_of`` cannot see (KeyError: a section checks its own keys) is left to a caller
        that sees the whole config."""
        out = []
        for key, need in self.values.items():
            try:
                value = value_of(key)
            except KeyError:
                continue
            if value != need:
                out.append(key)
        return out

    def __str__(self) -> str:
        """The needs as a config line reads them: ``data.task='arithmetic' and data.ops='+'``."""
        parts = [f"{key}={need!r}" for key, need in self.values.items()]
        return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)


NOTHING = Needs()
