"""Public fixtures: tiny run configs and tiny real engines, for tests and research code."""

from rljax.testing.configs import TINY_MODEL, arith_tiny

__all__ = ["TINY_MODEL", "arith_tiny"]
