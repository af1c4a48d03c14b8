"""Pallas kernels, imported as ``rljax.kernels``."""
