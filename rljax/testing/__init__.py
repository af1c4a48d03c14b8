"""Public fixtures for tests and research code: a tiny model config and tiny real engines.

No production recipe lives here: those are in configs/ (``rljax.configs``).
"""

from rljax.testing.configs import TINY_MODEL

__all__ = ["TINY_MODEL"]
