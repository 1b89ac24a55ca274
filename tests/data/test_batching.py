import jax.numpy as jnp
import numpy as np
import pytest
import torch

import fitjax.data
from fitjax.data import batch_size_of, pad_batch


def test_public_names():
    assert fitjax.data.__all__ == sorted(fitjax.data.__all__)
    for name in fitjax.data.__all__:
        assert getattr(fitjax.data, name).__doc__


def test_batch_size_of():
    assert batch_size_of({"x": np.zeros((32, 8)), "y": (jnp.zeros(32), torch.zeros(32, 2))}) == 32
    assert batch_size_of(np.zeros((0, 3))) == 0
    disagree = r"`batch\['x'\]`: 4, `batch\['y'\]\[0\]`: 4, `batch\['y'\]\[1\]`: 3"
    with pytest.raises(ValueError, match=disagree):
        batch_size_of({"x": np.zeros(4), "y": [np.zeros(4), np.zeros(3)]})
    with pytest.raises(ValueError, match=r"`batch\['t'\]` is a scalar \(0.5\)"):
        batch_size_of({"x": np.zeros(4), "t": 0.5})
    with pytest.raises(ValueError, match=r"`batch` has no array leaves \(received None\)"):
        batch_size_of(None)


def test_pad_batch_repeats_the_last_row_and_masks_it():
    batch = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "y": (jnp.arange(3),)}
    padded, mask = pad_batch(batch, 5)
    assert padded["x"].shape == (5, 2) and padded["x"].dtype == np.float32
    np.testing.assert_array_equal(padded["x"][3:], [[4, 5], [4, 5]])
    np.testing.assert_array_equal(padded["y"][0], [0, 1, 2, 2, 2])
    assert isinstance(padded["y"][0], np.ndarray)
    assert mask.dtype == np.float32
    np.testing.assert_array_equal(mask, [1, 1, 1, 0, 0])


def test_pad_batch_full_batch_is_returned_unchanged():
    batch = {"x": np.zeros((4, 2))}
    padded, mask = pad_batch(batch, 4)
    assert padded is batch
    np.testing.assert_array_equal(mask, np.ones(4, np.float32))


def test_pad_batch_empty_batch_is_zeros():
    padded, mask = pad_batch({"x": np.zeros((0, 2), np.int32)}, 3)
    np.testing.assert_array_equal(padded["x"], np.zeros((3, 2), np.int32))
    np.testing.assert_array_equal(mask, np.zeros(3))


def test_pad_batch_errors():
    with pytest.raises(ValueError, match=r"at least the batch's 4 rows; received size=2"):
        pad_batch({"x": np.zeros(4)}, 2)
    with pytest.raises(TypeError, match=r"size=...\)` must be an int >= 0; received 4.0"):
        pad_batch({"x": np.zeros(4)}, 4.0)
