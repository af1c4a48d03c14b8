"""Pure scheduling policies: plain data in, decisions out; no threads, no clocks, no JAX.

The runtime (``rljax.runtime``) and the simulator (``rljax.sim``) drive these same objects with
the same inputs, so a policy validated in the simulator is the one a real run uses.
"""
