"""The pure policies and the simulator import with jax and flax absent (DESIGN.md)."""

import pkgutil
import subprocess
import sys

import rljax.policy
import rljax.sim

POLICY_MODULES = [f"rljax.policy.{m.name}" for m in pkgutil.iter_modules(rljax.policy.__path__)]
SIM_MODULES = [f"rljax.sim.{m.name}" for m in pkgutil.iter_modules(rljax.sim.__path__)]

BLOCKED = """
import sys
for name in ("jax", "jaxlib", "flax", "optax", "orbax"):
    sys.modules[name] = None  # any import of them raises ImportError
import importlib
for module in {modules!r}:
    importlib.import_module(module)
import rljax
assert "testing" in dir(rljax) and "StalenessBuffer" in rljax.__all__
assert rljax.StalenessBuffer.__module__ == "rljax.policy.staleness"
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "flax") and sys.modules[m])
assert not loaded, loaded
print("ok")
"""


def test_policy_and_sim_import_without_jax():
    modules = ["rljax.policy", *POLICY_MODULES, "rljax.sim", *SIM_MODULES]
    assert "rljax.policy.meter" in modules and "rljax.sim.simulator" in modules
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED.format(modules=modules)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_public_names_resolve_lazily():
    import rljax

    assert set(rljax.__all__) <= set(dir(rljax))
    assert rljax.ReallocatorConfig is rljax.policy.reallocation.ReallocatorConfig
    try:
        rljax.not_a_name  # noqa: B018
    except AttributeError as e:
        assert "not_a_name" in str(e)
    else:
        raise AssertionError("an unknown name must raise AttributeError")
