"""JAX (platform allocator: no pool, every buffer is a driver allocation) or CuPy (its default
memory pool): allocate, drop some, and print what the framework says it holds on the device
as 'STATS {json}', then leave with os._exit so nothing is freed afterwards."""
import json
import os
import sys

which = sys.argv[1]
if which == "jax":
    import jax
    import jax.numpy as jnp

    xs = [jnp.ones((1024, 1024), dtype=jnp.float32) * i for i in range(8)]
    for x in xs:
        x.block_until_ready()
    del xs[:4]
    live = sum(a.nbytes for a in jax.live_arrays())
    print("STATS " + json.dumps({"framework_live_bytes": live, "arrays": len(xs)}), flush=True)
elif which == "cupy":
    import cupy

    xs = [cupy.ones((1024, 1024), dtype=cupy.float32) * i for i in range(8)]
    del xs[:4]
    cupy.cuda.Device().synchronize()
    pool = cupy.get_default_memory_pool()
    print("STATS " + json.dumps({"framework_live_bytes": pool.total_bytes(), "arrays": len(xs)}), flush=True)
os._exit(0)
