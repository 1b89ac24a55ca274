"""Whether the train step donates the state: yes, except where it measurably costs on XLA:CPU.

Donating the state lets XLA write the new state into the old one's buffers: no output buffers to
allocate per step (the tiny and MNIST-sized MLPs of `benchmarks/overhead.py` run 13-19% faster)
and one copy of the state in memory instead of two.

XLA:CPU allocates each call's scratch buffer ("temp") with `malloc`. glibc serves a request
over 32 MiB (`_MMAP_LIMIT`, its largest mmap threshold) with fresh pages, so every page of such a
scratch buffer is faulted in again on every step. A donated program keeps more values in scratch
(its outputs cannot go to fresh buffers), and those bytes are faulted too: for the small CNN of
`benchmarks/overhead.py` (135 MiB of scratch, 10 MiB of state) donation made each step 5-10% slower.

So on CPU, when the donated step's scratch is over `_MMAP_LIMIT`, the state is small next to it
(at most a quarter: not donating adds a state's worth of memory) and every state leaf is under
`_MMAP_LIMIT` (undonated outputs come from malloc's reused heap, not fresh pages), the step is
compiled again without donation, once, at its first call. Everywhere else the state is donated.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

__all__ = ["donates", "donating"]

_MMAP_LIMIT = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
_STATE_SHARE = 4  # donation is kept when the state is more than 1/4 of the scratch


def donates(*, platform: str, temp_bytes: int, state_bytes: int, largest_leaf_bytes: int) -> bool:
    """Whether a train step with these sizes (from the donated program) should donate its state."""
    if platform != "cpu" or temp_bytes <= _MMAP_LIMIT:
        return True
    return state_bytes * _STATE_SHARE > temp_bytes or largest_leaf_bytes >= _MMAP_LIMIT


def donating(donated: Callable, undonated: Callable[[], Callable], *, platform: str) -> Callable:
    """`step(state, inputs)`: `donated` (a jitted step that donates the state), or the step
    `undonated()` builds when `donates` says no for the program compiled at the first call.
    Off CPU that is always `donated`, returned as it is."""
    if platform != "cpu":
        return donated
    chosen: Callable | None = None

    def choose(state: Any, inputs: Any) -> Callable:
        compiled = donated.lower(state, inputs).compile()  # reused by `donated`'s own calls
        memory = compiled.memory_analysis()
        leaves = [leaf.nbytes for leaf in jax.tree.leaves(state)]
        if memory is None or donates(platform=platform, temp_bytes=memory.temp_size_in_bytes,
                                     state_bytes=sum(leaves), largest_leaf_bytes=max(leaves, default=0)):
            return donated
        return undonated()

    def step(state: Any, inputs: Any):
        nonlocal chosen
        if chosen is None:
            chosen = choose(state, inputs)
        return chosen(state, inputs)

    return step
