"""The progress bar's it/s is the speed of steps the device finished, not of calls the host queued."""

from __future__ import annotations

import io
import re
import time

import flax.linen as nn
import numpy as np
import optax
from helpers import quiet_trainer

import fitjax as fj

_BATCHES, _EVERY = 20, 5  # an epoch's batches and the log interval


class _Wide(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(1)(x)


class _Heavy(fj.LitModule):
    """Milliseconds of device work a step (matrix products), microseconds of host work: the host
    queues steps far faster than the device runs them."""

    def __init__(self):
        super().__init__()
        self.model = _Wide()

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(1e-4)


class _EpochClock(fj.Callback):
    """The wall time of each train epoch, from its start (nothing queued) to its end (the loop has
    waited for the epoch's last values: every step finished): a synced clock."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_train_epoch_start(self, trainer, module):
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.seconds.append(time.perf_counter() - self._start)


def test_plain_lines_show_the_speed_of_finished_steps_per_window():
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(_BATCHES * 256, 512)).astype(np.float32),
            "y": rng.normal(size=(_BATCHES * 256, 1)).astype(np.float32)}
    out, clock = io.StringIO(), _EpochClock()
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=_EVERY, enable_progress_bar=True,
                            callbacks=[fj.RichProgressBar(file=out), clock])
    trainer.fit(_Heavy(), fj.DataLoader(data, batch_size=256))
    lines = [line for line in out.getvalue().splitlines() if line.startswith("epoch 1 ")]
    rates = [float(re.search(r"  (\d+\.\d) it/s", line).group(1)) for line in lines]
    assert len(rates) == _BATCHES // _EVERY, lines
    # epoch 1 compiles nothing: its windows' rates account for its synced wall time
    implied = sum(_EVERY / rate for rate in rates)
    assert abs(implied - clock.seconds[1]) <= 0.2 * clock.seconds[1], (rates, implied, clock.seconds)
    # the windows' own rates, not one rate repeated on each line
    assert len(set(rates)) > 1, rates
    # epoch 0 compiled its step (most of its wall time, ~2.4 s against ~0.8 s of steps): left out
    first = [float(re.search(r"  (\d+\.\d) it/s", line).group(1)) for line in out.getvalue().splitlines()
             if line.startswith("epoch 0 ")]
    assert sum(_EVERY / rate for rate in first) < 0.6 * clock.seconds[0], (first, clock.seconds)
