"""Every config file declares its variants, and every variant builds.

Run configs must also pass rljax.config's validation and agree with their typed ``recipe``;
simulator configs (configs/sim/) are built, not run.
"""

import importlib.util
import pathlib

import pytest
from rljax.configs import arith_tiny

from rljax import config as C

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = sorted(p for p in (ROOT / "configs").rglob("*.py") if p.name != "__init__.py")
OLD_SMALL_NAMES = {"test", "runlocal", "tiny", "debug", "smoke"}  # 'small' says it for all


def load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _name(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


CASES = [(p, v) for p in FILES for v in ("", *getattr(load(p), "VARIANTS", ()))]


def test_config_files_found():
    names = {_name(p) for p in FILES}
    assert {"configs/arith_tiny.py", "configs/sim/pod_compare.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_every_config_declares_its_variants(path):
    variants = getattr(load(path), "VARIANTS", None)
    assert isinstance(variants, tuple), f"{_name(path)}: declare VARIANTS = (...) at module level"
    assert all(v and isinstance(v, str) for v in variants), variants
    assert not OLD_SMALL_NAMES & set(variants), f"{_name(path)}: name the CPU variant 'small'"


@pytest.mark.parametrize("path, variant", CASES, ids=[f"{_name(p)}:{v}" for p, v in CASES])
def test_every_variant_builds(path, variant):
    module = load(path)
    built = module.get_config(variant)
    assert built.to_dict()
    if not hasattr(module, "recipe"):  # a simulator scenario
        assert _name(path).startswith("configs/sim/")
        return
    cfg = C.from_config_dict(built)
    assert isinstance(cfg, C.RunConfig)
    assert cfg == module.recipe(variant)


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_unknown_variant_is_one_line_naming_the_variants(path):
    module = load(path)
    with pytest.raises(ValueError) as exc:
        module.get_config("no_such_variant")
    message = str(exc.value)
    assert "\n" not in message
    assert "'no_such_variant'" in message and _name(path) in message
    assert all(repr(v) in message for v in module.VARIANTS)


def test_small_variants_shrink_their_run():
    for path, variant in CASES:
        module = load(path)
        if variant != "small" or not hasattr(module, "recipe"):
            continue
        full, small = module.recipe(), module.recipe("small")
        assert small.num_steps < full.num_steps, _name(path)


def test_default_recipe_is_reachable_from_the_package_and_testing():
    from rljax.testing import TINY_MODEL

    assert arith_tiny.recipe().model == TINY_MODEL
    assert C.from_config_dict(arith_tiny.get_config()) == arith_tiny.recipe()
    # The async recipe is the default recipe on a 6/2 split: one warm start for both.
    async_cfg = load(ROOT / "configs" / "arith_async.py").recipe()
    assert (async_cfg.sft, async_cfg.model, async_cfg.data) == (
        arith_tiny.recipe().sft,
        TINY_MODEL,
        arith_tiny.recipe().data,
    )
