import json

import grain
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import DistributedSampler, TensorDataset

from fitjax.data import DataLoader, DataModule, as_loader

WRAP_HINT = r"; wrap it: `fj.DataLoader\(data, batch_size=32, shuffle=True\)`"


def ys(loader):
    return np.concatenate([batch["y"] for batch in loader])


def test_a_fitjax_loader_is_returned_as_is():
    loader = DataLoader({"y": np.arange(4)}, batch_size=2)
    assert as_loader(loader) is loader


def test_torch_dataloader_yields_numpy_batches_with_the_same_values():
    x = torch.randn(10, 3)
    y = torch.arange(10)
    loader = as_loader(TorchDataLoader(TensorDataset(x, y), batch_size=4))
    assert len(loader) == 3
    batches = list(loader)
    assert [len(b[1]) for b in batches] == [4, 4, 2]
    for xb, yb in batches:
        assert isinstance(xb, np.ndarray) and xb.dtype == np.float32
        assert isinstance(yb, np.ndarray) and yb.dtype == np.int64
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), x.numpy())
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y.numpy())


def test_torch_set_epoch_reaches_a_distributed_sampler():
    dataset = TensorDataset(torch.arange(40))
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = as_loader(TorchDataLoader(dataset, batch_size=8, sampler=sampler))

    def order(epoch):
        loader.set_epoch(epoch)
        return np.concatenate([b[0] for b in loader])

    assert sampler.epoch == 0
    first, second = order(0), order(1)
    assert sampler.epoch == 1
    assert sorted(first) == sorted(second) == list(range(40))
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(order(0), first)


def test_torch_tensors_needing_grad_or_in_bfloat16_become_numpy():
    batches = [{"w": torch.ones(2, requires_grad=True), "h": torch.ones(2, dtype=torch.bfloat16)}]
    (batch,) = list(as_loader(batches))
    assert isinstance(batch["w"], np.ndarray)
    assert batch["h"].dtype == jnp.bfloat16 and batch["h"].tolist() == [1.0, 1.0]


def test_a_torch_dataset_must_be_batched_first():
    with pytest.raises(TypeError, match=r"`train_data` received a torch dataset \(TensorDataset\)"):
        as_loader(TensorDataset(torch.arange(4)))


def test_grain_map_dataset_pipeline():
    dataset = grain.MapDataset.source(np.arange(10)).map(lambda i: {"y": i, "x": i * 0.5}).batch(4)
    loader = as_loader(dataset)
    assert len(loader) == 3
    batches = list(loader)
    assert [len(b["y"]) for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), np.arange(10) * 0.5)
    np.testing.assert_array_equal(ys(loader), np.arange(10))  # re-iterable: a second epoch


def test_grain_iter_dataset_has_no_length_but_iterates():
    dataset = grain.MapDataset.source(np.arange(7)).to_iter_dataset().batch(3)
    loader = as_loader(dataset)
    with pytest.raises(TypeError, match="has no length"):
        len(loader)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]


def test_grain_dataset_resumes_mid_epoch():
    def make():
        source = grain.MapDataset.source(np.arange(20)).shuffle(seed=3).map(lambda i: {"y": i})
        return as_loader(source.batch(3), name="val_data")

    expected = ys(make())
    first = make()
    it = iter(first)
    seen = [next(it)["y"], next(it)["y"]]
    state = first.state_dict()
    assert state["epoch"] == 0
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    resumed.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate(seen + [ys(resumed)]), expected)
    np.testing.assert_array_equal(ys(resumed), expected)  # the next pass starts over
    resumed.set_epoch(1)
    assert resumed.state_dict() == {"epoch": 1, "iterator": None}  # no position in epoch 1 yet
    with pytest.raises(ValueError, match=r"`val_data.load_state_dict\(state\)` expects"):
        resumed.load_state_dict({"batches_seen": 2})


def test_grain_dataloader_resumes_with_a_json_friendly_state():
    def make():
        sampler = grain.samplers.IndexSampler(
            num_records=10, shuffle=True, seed=1, num_epochs=1,
            shard_options=grain.sharding.NoSharding(),
        )
        return as_loader(grain.DataLoader(
            data_source=np.arange(10), sampler=sampler,
            operations=[grain.transforms.Batch(batch_size=4)],
        ))

    expected = np.concatenate(list(make()))
    first = make()
    it = iter(first)
    head = next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert isinstance(state["iterator"], str)
    resumed = make()
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate([head, *resumed]), expected)


def test_a_list_of_batches_is_reiterable_and_converted_per_batch():
    batches = [{"x": jnp.arange(3), "id": "a"}, {"x": torch.arange(3), "id": "b"}]
    loader = as_loader(batches)
    assert len(loader) == 2
    for _ in range(2):
        got = list(loader)
        assert all(isinstance(b["x"], np.ndarray) for b in got)
        assert [b["id"] for b in got] == ["a", "b"]  # leaves that are no arrays pass through


def test_a_custom_iterable_gets_set_epoch_and_keeps_its_state():
    class Stream:
        def __init__(self):
            self.epoch, self.position = 0, 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            for i in range(self.position, 3):
                self.position = i + 1
                yield {"y": np.full(2, 10 * self.epoch + i)}

        def state_dict(self):
            return {"position": self.position}

        def load_state_dict(self, state):
            self.position = state["position"]

    stream = Stream()
    loader = as_loader(stream)
    loader.set_epoch(2)
    assert stream.epoch == 2
    it = iter(loader)
    next(it)
    assert loader.state_dict() == {"position": 1}
    fresh = Stream()
    resumed = as_loader(fresh)
    resumed.load_state_dict({"position": 1})
    resumed.set_epoch(2)
    assert ys(resumed).tolist() == [21, 21, 22, 22]
    with pytest.raises(TypeError, match="`train_data` \\(Stream\\) has no length"):
        len(resumed)


def test_a_plain_iterable_has_no_state_methods():
    assert not hasattr(as_loader([{"y": np.zeros(2)}]), "state_dict")
    assert not hasattr(as_loader(TorchDataLoader(TensorDataset(torch.zeros(2)))), "state_dict")


def test_a_generator_gives_one_pass_then_a_clear_error():
    def stream():
        for i in range(4):
            yield {"y": np.full(2, i)}

    loader = as_loader(stream())
    it = iter(loader)
    assert next(it)["y"].tolist() == [0, 0]
    assert ys(loader).tolist() == [1, 1, 2, 2, 3, 3]  # an unfinished pass continues the stream
    with pytest.raises(RuntimeError, match=r"`train_data` is a one-shot iterator \(generator\).*"
                                           r"Pass a re-iterable"):
        iter(loader)


@pytest.mark.parametrize(
    "data, described",
    [
        (np.zeros((100, 8)), r"a numpy array of shape \(100, 8\)"),
        (jnp.zeros((5,)), r"a jax array of shape \(5,\)"),
        (torch.zeros(3, 2), r"a torch tensor of shape \(3, 2\)"),
        (
            {"x": np.zeros((4, 2)), "y": np.zeros(4)},
            r"a dict of arrays \(\['x'\]: \(4, 2\), \['y'\]: \(4,\)\)",
        ),
        ((np.zeros((4, 2)), np.zeros(4)), r"a tuple of arrays \(\[0\]: \(4, 2\), \[1\]: \(4,\)\)"),
    ],
)
def test_raw_arrays_are_refused_with_the_wrapping_hint(data, described):
    with pytest.raises(TypeError, match=rf"^`val_data` received {described}{WRAP_HINT}$"):
        as_loader(data, name="val_data")


@pytest.mark.parametrize("junk", [None, 3, "digits.npz", {"lr": 0.1}, object()])
def test_junk_is_refused_with_what_is_accepted(junk):
    with pytest.raises(TypeError, match=r"`train_data` must be a fj.DataLoader, a torch.utils.data"
                                        r".DataLoader, a grain .* or an iterable of batches"):
        as_loader(junk)


def test_a_datamodule_is_refused_with_the_way_to_pass_it():
    with pytest.raises(TypeError, match=r"received a DataModule.*dm.train_dataloader\(\)"):
        as_loader(DataModule())
