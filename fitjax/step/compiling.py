"""`jit`: the one way fitjax jits a program (a train step, the state's init, an evaluation or
predict step, a piece's update, a block gather, generation's prefill and decode).

It is `Strategy.jit` (the program traced for the mesh's platform, with the mesh: FSDP adds its
logical axis rules) given the platform's compiler options (`xla_cpu`'s on CPU: LLVM's level 2,
which compiles faster; `xla_tpu`'s on TPU) under the caller's own. The persistent compile cache
is JAX's process-wide setting (`fitjax.loop._compile_cache`), so every program jitted here uses
it without being told.
"""

from __future__ import annotations

from typing import Any, Callable

from fitjax.step import xla_cpu, xla_tpu
from fitjax.strategies import Strategy

__all__ = ["compiler_options", "jit"]


def compiler_options(platform: str, options: dict | None = None) -> dict | None:
    """`options` with the platform's own under them (`xla_cpu`'s on CPU, `xla_tpu`'s on TPU)."""
    return xla_tpu.compiler_options(platform, xla_cpu.compiler_options(platform, options))


def jit(strategy: Strategy, fn: Callable, *, in_shardings: Any = None, out_shardings: Any = None,
        donate_argnums: tuple[int, ...] = (), options: dict | None = None, fetch_host: bool = True) -> Callable:
    """`fn` jitted by `strategy` (`Strategy.jit`) with its platform's compiler options under
    `options`. A sharding not given follows the arguments' placement (in) or XLA's choice (out).
    `fetch_host=False`: arguments kept in host memory reach `fn` there (`Strategy.jit`)."""
    return strategy.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums,
                        compiler_options=compiler_options(strategy.platform, options), fetch_host=fetch_host)
