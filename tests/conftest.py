"""Test setup: 8 fake CPU devices, forced before JAX initialises its backends."""

import os
import sys

import pytest

# `python -m pytest` puts the working directory first on sys.path. From the repository root
# that makes the source folder kernels/ (installed as rljax.kernels) importable as `kernels`,
# which shadows the PyPI package of that name: transformers (the parity reference) imports it
# when it is installed, and fails on ours. So the root goes to the end of sys.path: installed
# packages come first, and a process-mode reward pool's children still import test modules.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT] + [_ROOT]

os.environ["JAX_NUM_CPU_DEVICES"] = "8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Keep XLA from grabbing every core per fake device; 2-core CI machine.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# The tests' programs are tiny and compiled once or twice each: compile time, not run time, is
# most of the suite. LLVM's cheapest optimisation level cuts the suite's CPU time by about a
# quarter (measured on tests/learner + tests/engine and tests/runtime + tests/kernels). Every
# comparison a test makes is within this setting; the runs tests launch inherit it.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# One persistent XLA compilation cache per test session, inherited by the runs tests launch as
# subprocesses: the same tiny programs are compiled once, not once per process. A fresh
# directory each session, so no test reads a cache an older checkout wrote.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rljax-xla-cache-")
    # Every program, however quick to compile: most of a run's programs compile in under 0.2 s
    # each, and a relaunched run (a resume, a pod's next launch) read them back in 18 % less
    # CPU than it compiled them (arith_tiny, one step, on this 2-core machine).
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores, at most 4 (``--maxprocesses``).

    The multi-process tests spend part of their time waiting (pod barriers, heartbeats, a
    child's startup), and a worker running one leaves its core idle meanwhile: with one worker
    per core the suite kept 1.6 of this 2-core machine's cores busy on average (38 min of CPU
    in 24 min). A third worker takes a module while the others wait.
    """
    return min(4, (os.cpu_count() or 1) + 1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run first (a stable sort: the rest keep their order).

    Under pytest-xdist (the README's test command), a long multi-process test collected late
    would end the run alone on one worker; started first, it runs while the other workers take
    the short tests. Every worker sorts the same collection the same way, as xdist requires;
    ``--dist loadscope`` then keeps each module on one worker, so a module's fixtures (a real
    checkpoint loaded, an engine compiled) are built once, not once per worker, and
    ``--no-loadscope-reorder`` keeps this order (by default xdist hands out the modules with
    the most tests first, which left the one-test pod module to end the run alone).
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


_EXIT_STATUS = pytest.StashKey[int]()


# Tests that break checkpoint saves on purpose (killed before finalising, failing writes) leave
# orbax signalling threads waiting on keys that never come; Python's shutdown would join them
# until their timeouts (2-3 minutes of CI after the summary). Exit with pytest's own status
# once everything else has unconfigured, without joining them.
def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
