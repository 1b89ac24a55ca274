"""The data edges: what fit checks at its start, per host batch, and when data yields nothing."""

from __future__ import annotations

import re
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj
from fitjax.data._checks import check_batch, check_fit_data, checked_batches


def _batches(*sizes, d=8):
    """A list of host batches with these row counts."""
    data = regression_data(n=sum(sizes), d=d)
    bounds = np.cumsum((0, *sizes))
    return [{"x": data["x"][a:b], "y": data["y"][a:b]} for a, b in zip(bounds[:-1], bounds[1:])]


def test_a_last_batch_that_does_not_divide_over_the_devices_is_refused_at_fit_start():
    trainer = quiet_trainer(max_epochs=2, strategy="dp")  # 8 devices
    loader = fj.DataLoader(regression_data(n=100), batch_size=32)
    with pytest.raises(ValueError) as err:
        trainer.fit(Regressor(), loader)
    assert re.search(r"last batch of each epoch of `train_data` has 4 examples \(100 examples = 3 "
                     r"batches of 32 \+ 4\), which do not divide over the 8 devices", str(err.value))
    assert "drop_last=True" in str(err.value) and "96 examples" in str(err.value)
    assert trainer.global_step == 0 and trainer.state is None  # refused before building anything


def test_the_last_batch_passes_when_dropped_or_never_reached():
    data = regression_data(n=100)
    for loader, kwargs, steps in [
        (fj.DataLoader(data, batch_size=32, drop_last=True), {"max_epochs": 2}, 6),
        (fj.DataLoader(data, batch_size=32), {"max_epochs": 1, "limit_train_batches": 3}, 3),
        (fj.DataLoader(data, batch_size=32), {"max_steps": 3}, 3),
    ]:
        trainer = quiet_trainer(strategy="dp", **kwargs)
        trainer.fit(Regressor(), loader)
        assert trainer.global_step == steps


def test_a_torch_loader_whose_last_batch_does_not_divide_is_refused_at_fit_start():
    data = regression_data(n=100)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(data["x"]), torch.from_numpy(data["y"]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=16)
    with pytest.raises(ValueError, match=r"has 4 examples \(100 examples = 6 batches of 16 \+ 4\).* 8 devices"):
        quiet_trainer(max_epochs=1, strategy="fsdp").fit(Regressor(), loader)


def test_a_later_batch_with_leaves_of_different_lengths_is_refused_naming_each_leaf():
    batches = _batches(16, 16, 16)
    batches[2]["y"] = batches[2]["y"][:1]  # one device would broadcast it over the 16 rows
    for kwargs in [{"strategy": "single"}, {"strategy": "dp", "accumulate_grad_batches": 2}]:
        trainer = quiet_trainer(max_epochs=1, **kwargs)
        with pytest.raises(ValueError, match=r"^Batch 2 of epoch 0 of `train_data`: .*"
                                             r"`train_data\['x'\]`: 16, `train_data\['y'\]`: 1"):
            trainer.fit(Regressor(), batches)


def test_a_later_batch_that_does_not_divide_over_the_devices_names_its_size():
    trainer = quiet_trainer(max_epochs=1, strategy="dp", steps_per_execution=2)
    with pytest.raises(ValueError, match=r"^Batch 2 of epoch 0 of `train_data` has 12 examples, which do "
                                         r"not divide over the 8 devices.*drop_last=True"):
        trainer.fit(Regressor(), _batches(16, 16, 12))
    assert trainer.global_step == 2  # the batches before it trained


def test_string_and_object_leaves_name_the_key_and_dtype_in_train_and_eval():
    names = _batches(16)
    names[0]["name"] = np.array(["a"] * 16)
    with pytest.raises(TypeError, match=r"^Batch 0 of epoch 0 of `train_data`: the leaf "
                                        r"`train_data\['name'\]` has dtype <U1 \(strings\)"):
        quiet_trainer(max_steps=1, strategy="single").fit(Regressor(), names)
    objects = _batches(16)
    objects[0]["meta"] = np.empty(16, object)
    with pytest.raises(TypeError, match=r"^Batch 0 of `the test data`: the leaf .*\['meta'\]` has dtype "
                                        r"object \(Python objects\)"):
        quiet_trainer(strategy="single").test(Regressor(), objects)


def test_check_batch_accepts_what_jax_takes():
    batch = {"x": np.zeros((8, 2), jnp.bfloat16), "n": np.arange(8), "ok": np.ones(8, bool)}
    assert check_batch(batch, shards=8) == 8
    with pytest.raises(ValueError, match=r"`batch\['s'\]` is a scalar"):
        check_batch({"x": np.zeros(4), "s": 3.0})


class _OnePass:
    """Re-iterable in name only: its second pass yields nothing (a consumed stream)."""

    def __init__(self, batches):
        self.batches, self.passes = batches, 0

    def __iter__(self):
        self.passes += 1
        return iter(self.batches if self.passes == 1 else [])


def test_an_epoch_or_a_validation_that_yields_no_batch_warns():
    trainer = quiet_trainer(max_epochs=2, strategy="single")
    with pytest.warns(UserWarning) as record:
        trainer.fit(Regressor(), _OnePass(_batches(16, 16)), [])
    messages = [str(w.message) for w in record]
    assert any(m.startswith("`val_data` has no batches (its length is 0)") for m in messages)
    assert any(m.startswith("`train_data` yielded no batch in epoch 1: the epoch trained nothing") for m in messages)
    assert any(m.startswith("`train_data` (_OnePass) has no length") for m in messages)
    assert trainer.global_step == 2


def test_data_without_length_warns_only_when_nothing_bounds_the_run():
    with pytest.warns(UserWarning, match=r"has no length and neither `Trainer\(max_steps=...\)`"):
        quiet_trainer(max_epochs=1, strategy="single").fit(Regressor(), iter(_batches(16, 16)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet_trainer(max_steps=2, strategy="single").fit(Regressor(), iter(_batches(16, 16)))


def test_fit_start_sizes_with_several_processes_name_each_process_share():
    """Process p takes rows [16p, 16p + 16) of each global batch of 32: a last batch of 8 rows
    gives process 0 eight and process 1 none, which no global array can be built from."""
    loader = fj.DataLoader(regression_data(n=104), batch_size=32, process_index=0, process_count=2)
    with pytest.raises(ValueError, match=r"has 8 examples \(104 examples = 3 batches of 32 \+ 8\) \(per process: "
                                         r"\[8, 0\]\), which do not divide over the 2 devices of each of the 2 "
                                         r"processes.*drop_last=True.*\(96 or 128 examples\)"):
        check_fit_data(loader, shards=4, processes=2)
    check_fit_data(fj.DataLoader(regression_data(n=104), batch_size=32, drop_last=True, process_index=0,
                                 process_count=2), shards=4, processes=2)


def test_an_epoch_cut_to_nothing_by_limit_train_batches_is_not_warned_about():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(checked_batches(_batches(16), iter(()), epoch=3, limit=0)) == []
    with pytest.warns(UserWarning, match=r"`train_data` yielded no batch in epoch 3"):
        assert list(checked_batches(_batches(16), iter(()), epoch=3, limit=None)) == []
