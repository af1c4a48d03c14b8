"""Test setup: 8 fake CPU devices, forced before JAX initialises its backends."""

import os

os.environ["JAX_NUM_CPU_DEVICES"] = "8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Keep XLA from grabbing every core per fake device; 2-core CI machine.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
