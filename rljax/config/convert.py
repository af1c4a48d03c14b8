"""RunConfig <-> ml_collections.ConfigDict, and dotted-key ``replace``.

Experiment files return a ConfigDict (:func:`to_config_dict`) so that absl's
``--config.<section>.<key>=...`` overrides can edit it; the launcher turns it back into
validated dataclasses (:func:`from_config_dict`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections

from rljax.config.checks import ConfigError, _fail
from rljax.config.run_config import RunConfig


def to_config_dict(cfg: RunConfig) -> ml_collections.ConfigDict:
    """The ConfigDict form that experiment files return and absl overrides edit."""

    def convert(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            hints = typing.get_type_hints(type(obj))
            return {
                f.name: _none_placeholder(hints[f.name])
                if getattr(obj, f.name) is None
                else convert(getattr(obj, f.name))
                for f in dataclasses.fields(obj)
            }
        if isinstance(obj, Mapping):
            return {k: convert(v) for k, v in obj.items()}
        return obj

    return ml_collections.ConfigDict(convert(cfg))


def _none_placeholder(hint: Any) -> Any:
    """A None scalar field as a typed placeholder, so ``--config.x=...`` can still set it."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and args[0] in (bool, int, float, str):
        return ml_collections.config_dict.placeholder(args[0])
    return None


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise ConfigError(
            f"unknown config key '{key}': valid keys under '{prefix or '<root>'}' are "
            f"{', '.join(sorted(names))}"
        )
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                _fail(f"{prefix}{name}", value, f"a section of keys for {hint.__name__}")
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        elif _is_tuple(hint) and isinstance(value, list | tuple):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a section defined outside this module (the policies' settings)
        raise ConfigError(str(e)) from None


def _is_tuple(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is_tuple(a) for a in typing.get_args(hint))
    return origin is tuple


def _plain(value: Any) -> Any:
    if isinstance(value, ml_collections.ConfigDict | ml_collections.FrozenConfigDict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def from_config_dict(cd: Mapping[str, Any] | ml_collections.ConfigDict) -> RunConfig:
    """Validated :class:`RunConfig` from a (possibly overridden) ConfigDict or plain dict."""
    return _build(RunConfig, _plain(cd), "")


def replace(cfg: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` with dotted keys: ``replace(cfg, **{'learner.beta': 0.1})``."""
    nested: dict[str, dict[str, Any]] = {}
    flat = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    for head, sub in nested.items():
        flat[head] = replace(getattr(cfg, head), **sub)
    return dataclasses.replace(cfg, **flat)
