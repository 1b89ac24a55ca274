import jax.numpy as jnp
import numpy as np
import pytest
import torch

from fitjax.data import DataLoader


def make_data(n=10):
    return {"x": np.arange(n * 2, dtype=np.float32).reshape(n, 2), "y": np.arange(n)}


def epoch_rows(loader):
    return np.concatenate([batch["y"] for batch in loader])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n, batch_size", [(10, 3), (12, 4), (5, 8)])
def test_every_example_once_per_epoch(shuffle, n, batch_size):
    loader = DataLoader(make_data(n), batch_size=batch_size, shuffle=shuffle, seed=1)
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader)
        rows = np.concatenate([b["y"] for b in batches])
        assert sorted(rows) == list(range(n))
        if not shuffle:
            np.testing.assert_array_equal(rows, np.arange(n))
        for batch in batches:  # leaves stay aligned row by row
            np.testing.assert_array_equal(batch["x"][:, 0], batch["y"] * 2)
            assert batch["x"].dtype == np.float32 and isinstance(batch["y"], np.ndarray)


def test_shuffle_order_per_epoch_is_reproducible_and_independent_of_history():
    loader = DataLoader(make_data(50), batch_size=8, shuffle=True, seed=7)
    orders = []
    for epoch in range(4):
        loader.set_epoch(epoch)
        orders.append(epoch_rows(loader))
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[2], orders[3])
    fresh = DataLoader(make_data(50), batch_size=8, shuffle=True, seed=7)
    fresh.set_epoch(3)  # straight to epoch 3, no epochs before it
    np.testing.assert_array_equal(epoch_rows(fresh), orders[3])
    np.testing.assert_array_equal(orders[2], np.random.default_rng([7, 2]).permutation(50))
    other_seed = DataLoader(make_data(50), batch_size=8, shuffle=True, seed=8)
    assert not np.array_equal(epoch_rows(other_seed), orders[0])


def test_without_set_epoch_every_pass_replays_the_current_epoch():
    loader = DataLoader(make_data(30), batch_size=4, shuffle=True)
    np.testing.assert_array_equal(epoch_rows(loader), epoch_rows(loader))


@pytest.mark.parametrize("drop_last, sizes", [(False, [3, 3, 3, 1]), (True, [3, 3, 3])])
def test_drop_last(drop_last, sizes):
    loader = DataLoader(make_data(10), batch_size=3, drop_last=drop_last)
    assert len(loader) == len(sizes)
    assert [len(b["y"]) for b in loader] == sizes
    assert loader.num_examples == 10 and loader.batch_size == 3


def test_pytree_structures_and_array_kinds():
    x = np.arange(6)
    loader = DataLoader(x, batch_size=4)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]]
    nested = {"a": (jnp.arange(6), [torch.arange(6), x]), "b": {"c": x * 10}}
    (first, second) = list(DataLoader(nested, batch_size=4))
    assert first["a"][1][0].tolist() == [0, 1, 2, 3]
    assert isinstance(first["a"], tuple) and isinstance(first["a"][1], list)
    assert all(isinstance(leaf, np.ndarray) for leaf in [first["a"][0], *first["a"][1]])
    assert second["b"]["c"].tolist() == [40, 50]


def test_torch_leaves_are_not_copied():
    tensor = torch.arange(6)
    loader = DataLoader({"t": tensor}, batch_size=6)
    tensor[0] = 100  # the loader reads the tensor's memory, not a copy of it
    assert next(iter(loader))["t"][0] == 100


def test_resume_mid_epoch_equals_an_uninterrupted_epoch():
    data = make_data(23)
    reference = DataLoader(data, batch_size=4, shuffle=True, seed=3)
    reference.set_epoch(2)
    expected = [b["y"] for b in reference]

    first = DataLoader(data, batch_size=4, shuffle=True, seed=3)
    first.set_epoch(2)
    it = iter(first)
    seen = [next(it)["y"], next(it)["y"]]
    state = first.state_dict()
    assert state == {"epoch": 2, "batches_seen": 2}

    resumed = DataLoader(data, batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    resumed.set_epoch(2)  # the trainer selects the saved epoch again: the resume point stays
    rest = [b["y"] for b in resumed]
    assert len(seen) + len(rest) == len(expected)
    for got, want in zip(seen + rest, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert resumed.state_dict() == {"epoch": 2, "batches_seen": len(reference)}

    resumed.set_epoch(3)  # afterwards epochs go on normally
    reference.set_epoch(3)
    np.testing.assert_array_equal(epoch_rows(resumed), epoch_rows(reference))


def test_state_counts_batches_as_they_are_yielded():
    loader = DataLoader(make_data(10), batch_size=3)
    assert loader.state_dict() == {"epoch": 0, "batches_seen": 0}
    it = iter(loader)
    next(it)
    assert loader.state_dict()["batches_seen"] == 1
    list(it)
    assert loader.state_dict()["batches_seen"] == 4
    loader.set_epoch(1)
    assert loader.state_dict() == {"epoch": 1, "batches_seen": 0}


def test_a_loaded_state_is_dropped_when_another_epoch_is_selected():
    loader = DataLoader(make_data(10), batch_size=3)
    loader.load_state_dict({"epoch": 0, "batches_seen": 3})
    loader.set_epoch(1)
    assert len(list(loader)) == 4


def test_load_state_dict_rejects_foreign_states():
    loader = DataLoader(make_data(10), batch_size=3)
    with pytest.raises(ValueError, match=r"keys 'batches_seen' and 'epoch'.*\{'step': 3\}"):
        loader.load_state_dict({"step": 3})
    with pytest.raises(ValueError, match=r"batches_seen'\]` is 9.*only 4 batches"):
        loader.load_state_dict({"epoch": 0, "batches_seen": 9})
    with pytest.raises(TypeError, match=r"state\['epoch'\]` must be an int >= 0; received '1'"):
        loader.load_state_dict({"epoch": "1", "batches_seen": 0})


@pytest.mark.parametrize("shuffle, drop_last", [(False, False), (True, False), (True, True)])
def test_process_slices_concatenate_to_the_global_batch(shuffle, drop_last):
    data = make_data(21)
    kwargs = dict(batch_size=8, shuffle=shuffle, seed=5, drop_last=drop_last)
    single = DataLoader(data, **kwargs)
    parts = [DataLoader(data, process_index=p, process_count=2, **kwargs) for p in range(2)]
    for loader in (single, *parts):
        loader.set_epoch(1)
    assert len(parts[0]) == len(single) and parts[0].local_batch_size == 4
    for whole, first, second in zip(single, *parts, strict=True):
        for key in whole:
            np.testing.assert_array_equal(np.concatenate([first[key], second[key]]), whole[key])
    if not drop_last:  # the last global batch has 5 rows: 4 on process 0, 1 on process 1
        assert [len(b["y"]) for b in parts[1]][-1] == 1


def test_single_process_defaults_ask_jax():
    loader = DataLoader(make_data(10), batch_size=4)
    assert loader.local_batch_size == 4


def test_process_errors_name_both_numbers():
    with pytest.raises(ValueError, match=r"batch_size=10\)` is the global.*over the 4 processes"):
        DataLoader(make_data(), batch_size=10, process_count=4)
    with pytest.raises(ValueError, match=r"process_index=...\)` must be below process_count=2"):
        DataLoader(make_data(), batch_size=4, process_index=2, process_count=2)


@pytest.mark.parametrize(
    "batch_size, error, pattern",
    [
        (0, ValueError, r"batch_size=...\)` must be an int >= 1; received 0"),
        (-3, ValueError, r"received -3"),
        (2.5, TypeError, r"batch_size=...\)` must be an int >= 1; received 2.5"),
        (True, TypeError, r"received True"),
        ("32", TypeError, r"received '32'"),
    ],
)
def test_bad_batch_size(batch_size, error, pattern):
    with pytest.raises(error, match=pattern):
        DataLoader(make_data(), batch_size=batch_size)


def test_bad_data():
    with pytest.raises(ValueError, match=r"`data\['x'\]`: 10, `data\['y'\]`: 9"):
        DataLoader({"x": np.zeros((10, 2)), "y": np.zeros(9)}, batch_size=2)
    with pytest.raises(ValueError, match=r"is empty \(0 examples\)"):
        DataLoader({"x": np.zeros((0, 3))}, batch_size=2)
    with pytest.raises(TypeError, match=r"`data\['name'\]` is 'abc' \(type str\).*np.asarray"):
        DataLoader({"x": np.zeros(3), "name": "abc"}, batch_size=2)
    with pytest.raises(TypeError, match=r"`data\[0\]` is 1 \(type int\).*list is a container"):
        DataLoader([1, 2, 3], batch_size=2)
    with pytest.raises(ValueError, match=r"`data\['s'\]` is a scalar"):
        DataLoader({"x": np.zeros(3), "s": np.float32(1.0)}, batch_size=2)
    with pytest.raises(ValueError, match=r"`data` has no array leaves \(received \{\}\)"):
        DataLoader({}, batch_size=2)
    with pytest.raises(ValueError, match=r"would yield no batch from 10 examples"):
        DataLoader(make_data(), batch_size=16, drop_last=True)
    with pytest.raises(ValueError, match=r"seed=...\)` must be an int >= 0; received -1"):
        DataLoader(make_data(), batch_size=2, seed=-1)
    with pytest.raises(ValueError, match=r"set_epoch\(epoch\)` must be an int >= 0"):
        DataLoader(make_data(), batch_size=2).set_epoch(-1)
