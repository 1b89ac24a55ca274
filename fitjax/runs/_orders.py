"""`RunOrders`: a `fj.DataLoader(shuffle="per_run")` read by a fit of several runs, each run in
its own order.

Run i's order is the one the loader would draw with `seed + i` (run 0's is the loader's own), and
each batch holds every run's rows on a second axis, after the batch's: `[batch, runs, ...]`. The
batch axis stays first, so the strategy splits it over the devices as any batch, and stacking
micro-batches or steps in front of it changes nothing; the runs' step takes run i's column
(`RunAxis.step`). It costs `runs` gathers of the batch's rows on the host and `runs` times the
bytes sent per step, and the data is not kept on the devices (`fitjax.data.feed_for`).
"""

from __future__ import annotations

import numpy as np

from fitjax.data import DataLoader

__all__ = ["RunOrders"]


class RunOrders(DataLoader):
    """`loader`'s batches with each of `runs` runs' rows side by side: `[batch, runs, ...]`.

    Args:
        loader: a `fj.DataLoader(shuffle="per_run")`; its data, options and position are shared.
        runs: how many runs.
    """

    def __init__(self, loader: DataLoader, runs: int):  # noqa: super().__init__ would copy the checks' work
        vars(self).update(vars(loader))
        self.runs = runs

    def _order(self, epoch: int | None = None) -> np.ndarray:
        """`[n, runs]`: column i is run i's order (the loader's with `seed + i`)."""
        epoch = self._epoch if epoch is None else epoch
        return np.stack([np.random.default_rng([self.seed + i, epoch]).permutation(self._num_examples)
                         for i in range(self.runs)], axis=1)
