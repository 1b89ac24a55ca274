"""SpikeDetection: Lightning's rule judged inside the step, its stop (exception naming the batch,
the batch indices written), and `skip_update=True`, which drops the spiking step's update.

How the expected outcomes were produced: Lightning 2.6.6 in a scratch venv, a `LightningModule`
whose `training_step` returns `batch[0].mean() + 0 * w.sum()` over batches of 2 equal values,
one value a batch (the `SEQUENCES` below), `Trainer(max_epochs=2)` and
`SpikeDetection(exclude_batches_path=..., **kwargs)`: the exception's message and the JSON file
(or "no spike": both epochs ran).
"""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from helpers import quiet_trainer, regression_data

import fitjax as fj

NAN = float("nan")
SEQUENCES = [  # (per-batch losses, SpikeDetection kwargs, Lightning's spike batch or None)
    ([1.0, 0.9, 0.8, 0.85, 5.0, 0.7, 0.6, 0.5], dict(window=3, warmup=2), 4),
    ([1.0, 0.9, 0.8, 0.85, 2.0, 0.7, 0.6, 0.5], dict(window=3, warmup=2), None),
    ([1.0, 0.9, 0.8, 0.85, 2.0, 0.7, 0.6, 0.5], dict(window=3, warmup=2, rtol=None, atol=0.5), 4),
    ([1.0, 0.9, 0.8, 0.85, 2.0, 0.7, 0.6, 0.5], dict(window=3, warmup=2, rtol=1.0, atol=1.5), None),
    ([1.0, 0.9, NAN, 0.85, 0.7, 0.6], dict(window=3, warmup=1), 2),
    ([1.0, 0.9, NAN, 0.85, 9.0, 0.6], dict(window=3, warmup=1, finite_only=False), 4),
    ([1.0, 5.0, 0.8, 0.7], dict(window=3, warmup=2), None),  # in the warmup of both epochs
    ([1.0, 1.2, 1.3, 1.25, 0.1, 1.4], dict(window=3, warmup=2, mode="max", rtol=0.5), 4),
    ([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.04], dict(window=2, warmup=1, rtol=0.3), None),
]


class Given(fj.LitModule):
    """The batch's `v` as the loss (the model takes part with a zero weight)."""

    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        return batch["v"].mean() + 0.0 * model(batch["x"]).mean()

    def configure_optimizer(self):
        return optax.sgd(0.1)


def _values(seq):
    v = np.repeat(np.asarray(seq, np.float32), 2)
    return fj.DataLoader({"v": v, "x": np.zeros((len(v), 3), np.float32)}, batch_size=2)


@pytest.mark.parametrize("seq, kwargs, expected", SEQUENCES)
def test_the_rule_finds_the_spikes_lightning_finds(tmp_path, seq, kwargs, expected):
    path = tmp_path / "skip.json"
    trainer = quiet_trainer(max_epochs=2, strategy="single",
                            callbacks=[fj.SpikeDetection(exclude_batches_path=path, **kwargs)])
    if expected is None:
        trainer.fit(Given(), _values(seq))
        assert trainer.current_epoch == 2 and not path.exists()
        return
    with pytest.raises(fj.callbacks.TrainingSpikeException, match=rf"^Training spike detected in batch {expected}$"):
        trainer.fit(Given(), _values(seq))
    assert json.loads(path.read_text()) == [expected - 1, expected]


class Scaled(fj.LitModule):
    """MSE times the batch's `scale`: one batch scaled up is a finite loss spike."""

    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean() * batch["scale"].mean()

    def configure_optimizer(self):
        return optax.sgd(0.05)


def _scaled(at=None, value=100.0, n=256, batch_size=16):
    data = regression_data(n=n)
    data["scale"] = np.ones((n,), np.float32)
    if at is not None:
        data["scale"][at * batch_size:(at + 1) * batch_size] = value
    return fj.DataLoader(data, batch_size=batch_size)


def _params(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(trainer.state.params))]


def test_stopping_leaves_the_state_of_the_step_before_the_spike(tmp_path):
    # reported at the epoch's end (no log step before it): the 10 steps after the spike changed nothing
    trainer = quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=50,
                            callbacks=[fj.SpikeDetection(exclude_batches_path=tmp_path, warmup=2)])
    with pytest.raises(fj.callbacks.TrainingSpikeException, match="batch 5"):
        trainer.fit(Scaled(), _scaled(at=5))
    assert trainer.global_step == 16
    before = quiet_trainer(max_steps=5, strategy="single")
    before.fit(Scaled(), _scaled(at=5))
    for a, b in zip(_params(trainer), _params(before), strict=True):
        np.testing.assert_array_equal(a, b)
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [4, 5]


@pytest.mark.parametrize("strategy", ["single", "dp", "fsdp"])
def test_skip_update_drops_the_spiking_steps_and_runs_on(strategy):
    spikes = fj.SpikeDetection(warmup=2, skip_update=True)
    trainer = quiet_trainer(max_epochs=1, strategy=strategy, log_every_n_steps=4, callbacks=[spikes])
    trainer.fit(Scaled(), _scaled(at=5))
    assert trainer.global_step == 16 and spikes.skipped == 1
    # the same run with batch 5's gradient zero: its SGD update leaves the parameters as they were
    reference = quiet_trainer(max_epochs=1, strategy="single")
    reference.fit(Scaled(), _scaled(at=5, value=0.0))
    for a, b in zip(_params(trainer), _params(reference), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_skip_update_resumes_exactly(tmp_path):
    def fit(max_steps, ckpt_path=None):
        spikes = fj.SpikeDetection(warmup=2, skip_update=True)
        trainer = quiet_trainer(max_steps=max_steps, strategy="dp", enable_checkpointing=True, callbacks=[
            spikes, fj.ModelCheckpoint(tmp_path / str(max_steps), save_last=True, save_top_k=0)])
        trainer.fit(Scaled(), _scaled(at=5), ckpt_path=ckpt_path)
        return trainer, spikes

    whole, whole_spikes = fit(12)
    first, _ = fit(8)  # after the skip
    resumed, resumed_spikes = fit(12, first.checkpoint_callback.last_model_path)
    assert resumed_spikes.skipped == whole_spikes.skipped == 1
    for a, b in zip(jax.tree.leaves(jax.device_get(resumed.state)), jax.tree.leaves(jax.device_get(whole.state))):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="lowest"), r"mode=\.\.\.\) must be one of \['min', 'max'\], got 'lowest'"),
    (dict(window=0), r"window=\.\.\.\) must be an int >= 1, got 0"),
    (dict(rtol="2"), r"rtol=\.\.\.\) must be a number or None"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fj.SpikeDetection(**kwargs)


def test_the_rule_reads_nothing_per_step(monkeypatch):
    from jax._src import array as jax_array

    def host_reads(steps, callbacks):
        reads = []
        original = jax_array.ArrayImpl._value
        with monkeypatch.context() as patch:
            patch.setattr(jax_array.ArrayImpl, "_value", property(lambda self: reads.append(1) or original.fget(self)))
            quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=50, callbacks=callbacks).fit(
                Scaled(), _scaled(n=16 * steps))
        return len(reads)

    # what the rule adds is read at the epoch's end: as much for 32 steps as for 16
    added = [host_reads(steps, [fj.SpikeDetection(skip_update=True)]) - host_reads(steps, [])
             for steps in (16, 32)]
    assert added[0] == added[1] > 0
