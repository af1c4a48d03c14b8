"""The layout an engine serves its weights in (rljax.engine.weights): chosen once when the
engine is built, used by every step, and named by the config's list of layouts."""

import numpy as np
import pytest
from flax import nnx

from rljax.config.checks import WEIGHTS_LAYOUTS
from rljax.engine.weights import SERVING_LAYOUTS
from rljax.models.serving import ServingDecoder
from rljax.models.transformer import abstract_decoder
from rljax.testing.configs import TINY_MODEL
from rljax.testing.engines import tiny_engine

SERVED_TYPE = {"stacked": nnx.State, "per_layer": ServingDecoder}


def test_the_config_names_every_serving_layout():
    assert set(WEIGHTS_LAYOUTS) == {"auto", *SERVING_LAYOUTS}
    assert all(SERVING_LAYOUTS[name].name == name for name in SERVING_LAYOUTS)


@pytest.mark.parametrize(("layout", "other"), [("per_layer", "stacked"), ("stacked", "per_layer")])
def test_weights_in_another_layout_are_a_one_line_error(layout, other):
    mine, theirs = tiny_engine(weights_layout=layout), tiny_engine(weights_layout=other)
    assert isinstance(mine.params, SERVED_TYPE[layout])
    with pytest.raises(TypeError, match=rf"serves weights_layout='{layout}'") as exc:
        mine.jetstream.prefill(params=theirs.params, padded_tokens=np.arange(1, 4), true_length=3)
    assert "\n" not in str(exc.value)
    with pytest.raises(TypeError, match=r"engine.load_params\(params\)"):
        mine.engine.generate(theirs.params, mine.engine.init_decode_state())


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_lower_generate_lowers_the_layout_the_engine_serves(layout):
    """Given the learner's (abstract) params state, the step lowers over the served weights."""
    engine = tiny_engine(weights_layout=layout).engine
    params = nnx.split(abstract_decoder(TINY_MODEL))[1]
    lowered = engine.lower_generate(params)
    (served, _), _ = lowered.args_info
    assert isinstance(served, SERVED_TYPE[layout])
