# Eight virtual CPU devices for the sharding tests. XLA reads the flag when JAX
# initialises its backend, so it must be set before anything imports jax.
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
