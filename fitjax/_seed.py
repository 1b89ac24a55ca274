"""`seed_everything`: Lightning's seeding of the host's random generators.

fitjax's own randomness comes from one JAX key (`Trainer(seed=)`); what JAX does not cover is the
host side a ported project still uses: a torch `DataLoader(shuffle=True)` draws its order from
torch's global generator, numpy augmentations from numpy's, `random.shuffle` from Python's.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import warnings

import numpy as np

__all__ = ["resolve_seed", "seed_everything", "seed_host"]

_MAX_SEED = 2**32 - 1  # numpy's bound, Lightning's too


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seeds Python's `random`, numpy's global generator and torch's (when torch is imported or
    installed), as Lightning's `seed_everything`; returns the seed.

    Sets `PL_GLOBAL_SEED` (and `PL_SEED_WORKERS` from `workers`) as Lightning does, so a script
    that reads them behaves the same. `Trainer(seed=s)` seeds the same generators (torch when
    already imported) and derives its JAX key from the same number.

    Args:
        seed: an int from 0 to 2**32 - 1; None reads `PL_GLOBAL_SEED`, else 0 (with a warning).
        workers: recorded in `PL_SEED_WORKERS` (torch DataLoader workers seeded from it by
            Lightning's `pl_worker_init_function`; fitjax's loaders are seeded by their own `seed`).
        verbose: log "Seed set to <seed>" (the "fitjax" logger, INFO).

    Example:
        >>> import fitjax as fj, numpy as np
        >>> fj.seed_everything(42, verbose=False)
        42
        >>> a = np.random.rand(); _ = fj.seed_everything(42, verbose=False); a == np.random.rand()
        True
    """
    seed = resolve_seed(seed, verbose=verbose)
    if verbose:
        logging.getLogger("fitjax").info(f"Seed set to {seed}")
    os.environ["PL_SEED_WORKERS"] = str(int(workers))
    seed_host(seed, import_torch=True)
    return seed


def resolve_seed(seed: int | None, *, verbose: bool) -> int:
    """`seed_everything`'s seed: `seed` checked, or `PL_GLOBAL_SEED`, or 0 (warned when `verbose`)."""
    if seed is None:
        env = os.environ.get("PL_GLOBAL_SEED")
        if env is None:
            seed = 0
            if verbose:
                warnings.warn(f"No seed found, seed set to {seed}", stacklevel=3)
        else:
            try:
                seed = int(env)
            except ValueError:
                raise ValueError(f"seed_everything: PL_GLOBAL_SEED={env!r} is not an int.") from None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed_everything(seed=...) must be an int from 0 to 2**32 - 1 (numpy's range), "
                         f"got {seed!r}.")
    return int(seed)


def seed_host(seed: int, *, import_torch: bool) -> None:
    """Seeds Python's, numpy's and torch's global generators with `seed` (0 .. 2**32 - 1) and
    sets `PL_GLOBAL_SEED`. Torch is seeded when imported, or installed with `import_torch`
    (`Trainer(seed=)` does not import it: ~3 s; a torch `DataLoader` means torch is imported)."""
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None:
        torch.manual_seed(seed)
