"""`LitModule.load_weights` / `load_state_dict`: weights from safetensors files, Hugging Face
folders, Orbax trees, fitjax checkpoints, msgpack and torch state dicts, checked by name, shape
and dtype and placed into the strategy's shardings."""

import json

import flax.linen as nn
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import torch
from flax import nnx, serialization

import fitjax as fj
from fitjax.module._weight_sources import SafetensorsFiles, save_safetensors
from helpers import quiet_trainer

TORCH_NAMES = {r"(\d+)\.weight": r"layers_\1.kernel", r"(\d+)\.bias": r"layers_\1.bias"}


class Net(fj.LitModule):
    """Linen `Dense(8 -> 64) relu Dense(64 -> 3)`, the same as the torch `Sequential` below."""

    def __init__(self, lr: float = 0.0):
        super().__init__()
        self.lr = lr
        self.model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(3)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(self.lr)


def torch_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))


def data(n=16):
    x = np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32)
    return {"x": x, "y": np.zeros((n, 3), np.float32)}


def fit(module, strategy="single"):
    trainer = quiet_trainer(max_steps=1, strategy=strategy)
    trainer.fit(module, fj.DataLoader(data(), batch_size=8))
    return trainer


def outputs(module, x):
    return np.asarray(module.model.apply({"params": module.variables[0]}, x))


def test_a_torch_state_dict_saved_as_safetensors_starts_an_fsdp_fit_each_device_reading_its_rows(tmp_path, monkeypatch):
    net = torch_net()
    save_safetensors({k: v.numpy() for k, v in net.state_dict().items()}, tmp_path / "net.safetensors")
    reads = []
    read = SafetensorsFiles.read
    monkeypatch.setattr(SafetensorsFiles, "read", lambda self, name, index: reads.append(
        (name, read(self, name, index).shape)) or read(self, name, index))

    module = Net()
    assert module.load_weights(tmp_path / "net.safetensors", mapping=TORCH_NAMES, transpose=r".*kernel") is None
    fit(module, fj.strategies.FSDP(min_size_to_shard=0))  # lr 0: the weights stay the loaded ones

    x = data()["x"]
    np.testing.assert_allclose(outputs(module, x), net(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
    kernel = module.variables[0]["layers_0"]["kernel"]  # [8, 64] from torch's [64, 8]: 64 split over 8 devices
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
    assert sorted({shape for name, shape in reads if name == "0.weight"}) == [(8, 8)]  # rows of [64, 8]

    module.lr = 0.1  # the load is done: each later fit continues from the weights the last one left
    fit(module)
    first = outputs(module, x)
    fit(module)
    assert not np.allclose(outputs(module, x), first)


def test_a_mismatched_name_or_shape_is_an_error_naming_each_array(tmp_path):
    net = torch_net()
    arrays = {k: v.numpy() for k, v in net.state_dict().items()}
    module = Net()
    module.load_weights(arrays, mapping=TORCH_NAMES)  # no transpose: the kernels' shapes are swapped
    with pytest.raises(ValueError) as error:
        fit(module)
    message = str(error.value)
    assert "layers_0.kernel (from 0.weight): shape (64, 8) in the source, (8, 64) in the model" in message
    assert "layers_2.kernel (from 2.weight): shape (3, 64)" in message
    assert "transpose=[regex]" in message

    arrays["extra.weight"] = np.zeros(3, np.float32)
    del arrays["2.bias"]
    module = Net()
    module.load_weights(arrays, mapping=TORCH_NAMES, transpose=r".*kernel")
    with pytest.raises(ValueError, match=r"(?s)layers_2.bias: missing from the source.*extra.weight: in the source"):
        fit(module)

    module.load_weights(arrays, mapping=TORCH_NAMES, transpose=r".*kernel", strict=False)
    with pytest.warns(UserWarning, match=r"missing \(kept as initialised\): \['layers_2.bias'\]; unexpected "
                                         r"\(ignored\): \['extra.weight'\]"):
        fit(module)
    x = data()["x"]
    np.testing.assert_allclose(outputs(module, x) - module.variables[0]["layers_2"]["bias"],
                               net(torch.from_numpy(x)).detach().numpy() - net[2].bias.detach().numpy(), atol=1e-5)


class NNXNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(8, 64, rngs=rngs)
        self.drop = nnx.Dropout(0.0, rngs=rngs)  # rng state in model_state: never expected from a file
        self.down = nnx.Linear(64, 3, rngs=rngs)

    def __call__(self, x):
        return self.down(self.drop(nnx.relu(self.up(x))))


class NNXModule(Net):
    def __init__(self):
        super().__init__()
        self.model = NNXNet(nnx.Rngs(0))


def test_an_nnx_model_reports_missing_and_unexpected_names_at_the_call():
    net = torch_net()
    state_dict = {**net.state_dict(), "head.weight": torch.zeros(2)}
    del state_dict["0.bias"]
    module = NNXModule()
    names = {"0.weight": "up.kernel", "2.weight": "down.kernel", "2.bias": "down.bias"}
    report = module.load_weights(state_dict, mapping=names.get, transpose=r".*kernel", strict=False)
    assert report.missing_keys == ["up.bias"] and report.unexpected_keys == []  # head.weight: dropped by .get
    assert set(report.loaded) == {"up.kernel", "down.kernel", "down.bias"}

    regexes = {r"0\.weight": "up.kernel", r"(\d)\.weight": r"down.kernel", r"2\.(bias)": r"down.\1"}
    report = module.load_weights(state_dict, mapping=regexes, transpose=r".*kernel", strict=False)
    assert report.unexpected_keys == ["head.weight"]
    with pytest.raises(ValueError, match=r"up.bias: missing from the source"):  # strict: at the call
        module.load_state_dict({k: v for k, v in state_dict.items() if k != "head.weight"})

    with pytest.raises(ValueError, match=r"up.kernel: dtype int32 in the source, float32 in the model"):
        module.load_weights({"up.kernel": np.zeros((8, 64), np.int32)}, strict=False)


def test_orbax_trees_fitjax_checkpoints_msgpack_and_sharded_hf_folders_load_the_same_weights(tmp_path):
    trained = Net(lr=0.1)
    trainer = quiet_trainer(max_steps=2, enable_checkpointing=True, default_root_dir=tmp_path / "run")
    trainer.fit(trained, fj.DataLoader(data(), batch_size=8))
    params = jax.device_get(trained.variables[0])
    x = data()["x"]
    expected = outputs(trained, x)

    ocp.PyTreeCheckpointer().save(tmp_path / "orbax", params)
    (tmp_path / "w.msgpack").write_bytes(serialization.msgpack_serialize(params))
    hf = tmp_path / "hf"  # two shards and their index, as `save_pretrained(max_shard_size=...)` writes
    hf.mkdir()
    save_safetensors({"layers_0.kernel": params["layers_0"]["kernel"]}, hf / "model-00001-of-00002.safetensors")
    save_safetensors({"layers_0.bias": params["layers_0"]["bias"], "layers_2.kernel": params["layers_2"]["kernel"],
                      "layers_2.bias": params["layers_2"]["bias"]}, hf / "model-00002-of-00002.safetensors")
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "layers_0.kernel": "model-00001-of-00002.safetensors",
        **{n: "model-00002-of-00002.safetensors" for n in ("layers_0.bias", "layers_2.kernel", "layers_2.bias")}}}))
    (checkpoint,) = (tmp_path / "run").rglob("*step=2*")

    for source in (tmp_path / "orbax", tmp_path / "w.msgpack", hf, checkpoint):
        module = Net()
        module.load_weights(source)
        fit(module, "dp")
        np.testing.assert_allclose(outputs(module, x), expected, atol=1e-6, err_msg=str(source))


def test_a_source_that_is_none_of_the_accepted_kinds_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"source='.*nowhere' does not exist: pass a `.safetensors` file"):
        Net().load_weights(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"mapping=...\): '\(' is not a regular expression"):
        Net().load_weights({}, mapping={"(": "x"})


def test_save_weights_hands_the_weights_back_to_torch_under_its_names_and_layouts(tmp_path):
    from safetensors.torch import load_file

    module = Net(lr=0.1)
    with pytest.raises(ValueError, match=r"has no weights yet; fit it"):
        module.save_weights(tmp_path / "early.safetensors")
    fit(module)
    written = module.save_weights(tmp_path / "net.safetensors", transpose=r".*kernel",
                                  mapping={r"layers_(\d+)\.kernel": r"\1.weight", r"layers_(\d+)\.bias": r"\1.bias"})
    assert written["0.weight"] == (64, 8)
    net = torch_net()
    net.load_state_dict(load_file(tmp_path / "net.safetensors"))  # strict: every name and shape torch's
    x = data()["x"]
    np.testing.assert_allclose(net(torch.from_numpy(x)).detach().numpy(), outputs(module, x), atol=1e-5)
