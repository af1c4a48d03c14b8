"""A decode step reads and writes the KV pools in place: its cost follows the pages it reads,
not the size of the pools.

Two copies used to hide in every step. Each layer's attention read ``pool[layer]``, a slice
that XLA's CPU backend materialises once the pool has a few hundred pages, so a step copied
every layer's whole pool (4 slots of SmolLM2, f32: 136 ms a step with pools for 4,032 tokens a
slot against 66 ms with pools for 83; docs/benchmarks.md). And a bfloat16 pool was converted to
float32 and back to take each layer's new keys. The tests read the compiled step (no timing):
no buffer the size of one layer's pool, and no floating-point buffer the size of the whole
pool.
"""

import dataclasses
import re

import numpy as np
import pytest

from rljax.engine.decode import call_inputs
from rljax.testing.configs import TINY_MODEL
from rljax.testing.engines import materialised, tiny_engine

BF16 = dict(dtype="bfloat16", param_dtype="bfloat16")


def _shapes(lines: list[str]) -> set[tuple[str, tuple[int, ...]]]:
    found = re.findall(r"= (\w+)\[([\d,]+)\]", "\n".join(lines))
    return {(dt, tuple(map(int, dims.split(",")))) for dt, dims in found}


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decode_step_copies_no_pool(dtype, steps):
    model = TINY_MODEL if dtype == "float32" else dataclasses.replace(TINY_MODEL, **BF16)
    # Pools for 416 tokens a slot: XLA fuses the slice of a small pool into its reader.
    tiny = tiny_engine(model=model, max_new_tokens=400, max_concurrent_decodes=2)
    engine, state = tiny.engine, tiny.engine.init_decode_state()
    pool = state.k_pages
    assert pool.dtype == ("float32" if dtype == "float32" else "uint16")
    if steps == 1:
        program, inputs = engine.steps.generate(None), ()
    else:
        limits = np.full(engine.max_concurrent_decodes, 8, np.int32)
        program = engine.steps.generate_steps(None, steps)
        _, inputs = call_inputs(steps, limits, (), engine.replicated())
    hlo = program.lower(tiny.params, state, *inputs).compile().as_text()
    shapes = _shapes(materialised(hlo))
    layer = pool.shape[1:]
    assert not {s for s in shapes if s[1] in (layer, (1, *layer))}, "a layer's pool copied"
    floats = {s for s in shapes if s[1] == pool.shape and s[0] in ("f32", "bf16")}
    assert floats <= ({("f32", pool.shape)} if dtype == "float32" else set()), floats
