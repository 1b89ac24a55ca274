"""8 virtual CPU devices for every test: set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import fitjax  # noqa: E402,F401  (first: it picks XLA:CPU's scheduler before the backends start)
import jax  # noqa: E402

assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in os.environ["XLA_FLAGS"]
assert jax.device_count() == 8, "conftest must run before anything imports jax"
