"""Per-role logical rules: collisions and indivisible shapes raise, specs follow the table."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from rljax.models.sharding import LEARNER_RULES, SAMPLER_RULES, ShardingRules, make_mesh


def test_rule_tables_map_logical_axes_per_role():
    expert = ("expert", "fsdp")
    assert LEARNER_RULES.spec(("embed", "heads", "head_dim")) == P(expert, "tensor", None)
    assert SAMPLER_RULES.spec(("embed", "heads", "head_dim")) == P(None, "tensor", None)
    assert SAMPLER_RULES.spec(("batch",)) == P(("expert", "data"))
    # On a mesh without an 'expert' axis (a dense run's), the rules leave it out.
    dense = make_mesh(jax.devices()[:4], {"fsdp": 2, "tensor": 2})
    assert LEARNER_RULES.on(dense, ("embed", "heads", "head_dim")) == P("fsdp", "tensor", None)
    moe = make_mesh(jax.devices()[:8], {"expert": 2, "fsdp": 2, "tensor": 2})
    spec = LEARNER_RULES.on(moe, ("layers", "experts", "expert_embed", "expert_mlp"))
    assert spec == P(None, "expert", "fsdp", "tensor")


def test_a_collision_raises_instead_of_replicating():
    rules = ShardingRules("learner", {"embed": "fsdp", "mlp": "fsdp"})
    with pytest.raises(ValueError, match="map both 'embed' and 'mlp' of w to mesh axis 'fsdp'"):
        rules.spec(("embed", "mlp"), name="w")


def test_unknown_logical_axis_is_named():
    with pytest.raises(ValueError, match="no entry for logical axis 'routers' of w"):
        LEARNER_RULES.spec(("routers",), name="w")


def test_indivisible_dimension_names_the_fix():
    mesh = make_mesh(jax.devices()[:4], {"fsdp": 4, "tensor": 1})
    with pytest.raises(ValueError, match="not divisible by mesh axes .'fsdp',. of size 4"):
        LEARNER_RULES.sharding(mesh, ("embed",), shape=(6,), name="norm")


def test_mesh_shape_must_fit_the_devices():
    with pytest.raises(ValueError, match="need 8 devices but 4 were given"):
        make_mesh(jax.devices()[:4], {"fsdp": 4, "tensor": 2})
