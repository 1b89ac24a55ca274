"""`LitModule.apply_lora` (qwix): only the adapters train and hold optimizer state, the base stays
bitwise, the merged export is the adapted model, fsdp trains (LoRA and QLoRA) as one device does,
and a checkpoint of the adapters alone resumes a fit bitwise on its base and refuses another."""

import flax.linen as nn
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from safetensors.numpy import load_file
from helpers import assert_trees_close, quiet_trainer

import fitjax as fj

X = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
RIGHT = (X[:, 1] > 0).astype(np.int32)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2, name="down")(nn.relu(nn.Dense(32, name="up")(x)))


class NNXNet(nnx.Module):
    def __init__(self, rngs):
        self.up, self.down = nnx.Linear(8, 32, rngs=rngs), nnx.Linear(32, 2, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.relu(self.up(x)))


class Classifier(fj.LitModule):
    def __init__(self, model=None):
        super().__init__()
        self.model = Net() if model is None else model

    def loss(self, model, batch):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    def configure_optimizer(self):
        return optax.adam(3e-2)


def fit(module, labels, steps, **kwargs):
    trainer = quiet_trainer(max_steps=steps, **{"strategy": "single", **kwargs})
    trainer.fit(module, fj.DataLoader({"x": X, "y": labels}, batch_size=16))
    return trainer


def loss(module, labels):
    logits = module.model.apply({"params": module.variables[0]}, X)
    return float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean())


def nbytes(tree):
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def based():
    """Random weights: a base that is wrong on the task, which the adapters correct."""
    return jax.device_get(Net().init(jax.random.key(0), X)["params"])


def adapted(based):
    module = Classifier()
    module.load_weights(based)  # the adapters are new: not expected from the source
    module.apply_lora(r".*", rank=2)
    return module


def test_only_the_adapters_train_and_hold_state_and_the_merged_export_is_the_adapted_model(based, tmp_path):
    module = adapted(based)
    trainer = fit(module, RIGHT, 30)
    params = jax.device_get(module.variables[0])
    for layer in ("up", "down"):  # the base, bitwise
        for name in ("kernel", "bias"):
            assert np.array_equal(params[layer][name], based[layer][name])
    adapters = {k: v for layer in params.values() for k, v in layer.items() if "_lora_" in k}
    assert len(adapters) == 2  # A and B of each layer (names repeat across layers)
    adapter_bytes = sum(nbytes(v) for layer in params.values() for k, v in layer.items() if "_lora_" in k)
    assert adapter_bytes * 2 <= nbytes(trainer.state.opt_state) <= adapter_bytes * 2 + 4  # Adam: 2 moments, 1 count
    base_loss = float(optax.softmax_cross_entropy_with_integer_labels(Net().apply({"params": based}, X), RIGHT).mean())
    assert loss(module, RIGHT) < 0.5 * base_loss

    written = module.save_weights(tmp_path / "merged.safetensors")  # W + A @ B * alpha / rank, no adapters
    assert set(written) == {"up.kernel", "up.bias", "down.kernel", "down.bias"}
    flat = load_file(tmp_path / "merged.safetensors")
    merged = {layer: {name: flat[f"{layer}.{name}"] for name in ("kernel", "bias")} for layer in ("up", "down")}
    np.testing.assert_allclose(np.asarray(Net().apply({"params": merged}, X)),
                               np.asarray(module.model.apply({"params": module.variables[0]}, X)), atol=1e-5)
    written = module.save_weights(tmp_path / "adapters.safetensors", lora="adapters")
    assert sorted(written) == ["down.kernel_lora_a", "down.kernel_lora_b", "up.kernel_lora_a", "up.kernel_lora_b"]

    again = adapted(based)  # the adapters file onto the same base: the trained model again
    again.load_adapters(tmp_path / "adapters.safetensors")
    quiet_trainer(strategy="single").validate(again, fj.DataLoader({"x": X, "y": RIGHT}, batch_size=16))
    assert_trees_close(jax.device_get(again.variables[0]), params, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"load_adapters\('a.safetensors'\): the model has no adapters"):
        Classifier().load_adapters("a.safetensors")


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_fsdp_with_accumulation_trains_lora_and_qlora_as_one_device(based, quantize):
    runs = {}
    for strategy in ("single", fj.strategies.FSDP(min_size_to_shard=0)):  # dp: the same program, replicated
        module = Classifier()
        module.load_weights(based)
        module.apply_lora(r".*", rank=2, quantize=quantize)
        trainer = fit(module, RIGHT, 3, strategy=strategy, accumulate_grad_batches=2)
        runs[str(strategy)] = jax.device_get(module.variables[0])
        if quantize and strategy != "single":  # fsdp: the int8 base sharded, as a float one is
            assert "fsdp" in str(trainer.state.params["up"]["kernel"].array.qvalue.sharding.spec)
    first, *others = runs.values()
    for other in others:
        assert_trees_close(other, first, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_trains_the_adapters_and_keeps_the_float32_base_bitwise(based, precision):
    module = adapted(based)
    before = float(optax.softmax_cross_entropy_with_integer_labels(Net().apply({"params": based}, X), RIGHT).mean())
    trainer = fit(module, RIGHT, 12, precision=precision, gradient_clip_val=1.0)
    params = jax.device_get(module.variables[0])
    for layer in ("up", "down"):  # the base: float32 as loaded, not one bit moved
        assert params[layer]["kernel"].dtype == np.float32
        assert np.array_equal(params[layer]["kernel"], based[layer]["kernel"])
        assert np.array_equal(params[layer]["bias"], based[layer]["bias"])
    assert loss(module, RIGHT) < 0.7 * before  # the adapters, trained in half precision, fix the task
    moments = [x for x in jax.tree.leaves(trainer.state.opt_state) if np.ndim(x)]
    adapters = [v for k, v in jax.tree_util.tree_leaves_with_path(params) if "lora" in jax.tree_util.keystr(k)]
    assert adapters and nbytes(moments) == 2 * nbytes(adapters)  # Adam's two moments: the adapters' only


def test_an_nnx_model_takes_adapters_from_an_example_input_and_keeps_its_base():
    module = Classifier(NNXNet(nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"apply_lora\(example_input=...\) is needed for an NNX model"):
        Classifier(NNXNet(nnx.Rngs(0))).apply_lora()
    before = jax.device_get(nnx.to_pure_dict(nnx.state(module.model, nnx.Param)))
    module.apply_lora(r".*up.*", rank=4, example_input=X[:2])
    fit(module, RIGHT, 5, precision="bf16-mixed")
    params = jax.device_get(module.variables[0])
    assert set(params["up"]) == {"kernel", "bias", "kernel_lora_a", "kernel_lora_b"} and "kernel_lora_a" not in params[
        "down"]
    assert_trees_close({k: params[k][n] for k in ("up", "down") for n in ("kernel", "bias")},
                       {k: before[k][n] for k in ("up", "down") for n in ("kernel", "bias")}, rtol=0, atol=0)
    assert np.abs(params["up"]["kernel_lora_b"]).max() > 0

    quantized = Classifier(NNXNet(nnx.Rngs(0)))  # QLoRA: qwix quantizes the NNX kernel too
    quantized.apply_lora(r".*up.*", rank=4, example_input=X[:2], quantize="int8")
    fit(quantized, RIGHT, 3)
    up = jax.device_get(quantized.variables[0])["up"]
    kernel = up["kernel"]["array"]
    assert kernel["qvalue"].dtype == np.int8 and np.abs(up["kernel_lora_b"]).max() > 0
    np.testing.assert_allclose(kernel["qvalue"] * kernel["scale"], before["up"]["kernel"], atol=kernel["scale"].max())


def test_qlora_trains_the_adapters_on_an_int8_base_that_stays_quantized_and_unchanged(based):
    import qwix

    module = Classifier()
    module.load_weights(based)  # floats, quantized when the state is built
    module.apply_lora(r".*", rank=2, quantize="int8")
    abstract = jax.eval_shape(module.model.init, jax.random.key(0), X)["params"]
    expected = jax.device_get(qwix.quantize_params(jax.tree.map(jax.numpy.asarray, based), abstract))
    trainer = fit(module, RIGHT, 30)
    params = jax.device_get(module.variables[0])
    for layer in ("up", "down"):  # the base: int8, bitwise the quantized source; the bias as it was
        kernel = params[layer]["kernel"].array
        assert kernel.qvalue.dtype == np.int8
        assert np.array_equal(kernel.qvalue, expected[layer]["kernel"].array.qvalue)
        assert np.array_equal(kernel.scale, expected[layer]["kernel"].array.scale)
        assert np.array_equal(params[layer]["bias"], based[layer]["bias"])
    assert not any(np.issubdtype(np.asarray(x).dtype, np.integer) for x in jax.tree.leaves(trainer.state.opt_state)
                   if np.ndim(x))  # only the adapters' float moments
    base_loss = float(optax.softmax_cross_entropy_with_integer_labels(Net().apply({"params": based}, X), RIGHT).mean())
    assert loss(module, RIGHT) < 0.5 * base_loss
    with pytest.raises(ValueError, match=r"apply_lora\(quantize=...\) must be None \(LoRA\) or one of \['int8'"):
        Classifier().apply_lora(quantize="int3")


def test_an_adapters_only_checkpoint_resumes_a_qlora_fit_bitwise_on_its_base_and_refuses_another(based, tmp_path):
    def run(steps, base=based, ckpt_path=None, save=True):
        module = Classifier()
        module.load_weights(base)
        module.apply_lora(r".*up", rank=2, dropout=0.25, quantize="int8")
        extra = [fj.ModelCheckpoint(tmp_path, save_last=True, every_n_train_steps=3, weights="trainable")] * save
        trainer = quiet_trainer(max_steps=steps, strategy="single", enable_checkpointing=save, callbacks=extra)
        trainer.fit(module, fj.DataLoader({"x": X, "y": RIGHT}, batch_size=16, shuffle=True), ckpt_path=ckpt_path)
        return trainer

    whole = run(6, save=False)
    run(3)  # saved after step 3 of 4 in epoch 0: the adapters, their Adam moments, the loop position
    (saved,) = [p for p in tmp_path.iterdir() if p.name.startswith("epoch")]
    tree = ocp.StandardCheckpointHandler().metadata(saved / "state").tree
    assert jax.tree_util.tree_map(lambda m: m.shape, tree["params"]) == {
        "up": {"kernel_lora_a": (8, 2), "kernel_lora_b": (2, 32)}}  # no base: neither int8 nor float
    resumed = run(6, ckpt_path="last")
    assert resumed.global_step == 6
    assert_trees_close(resumed.state.params, whole.state.params, rtol=0, atol=0)
    assert_trees_close(resumed.state.opt_state, whole.state.opt_state, rtol=0, atol=0)

    saved = resumed.checkpoint_callback.last_model_path
    other = {**based, "down": {**based["down"], "bias": based["down"]["bias"] + 1}}
    with pytest.raises(ValueError, match=r"frozen base weights are not the ones .*\['down.bias'\] \(1 of 5 "
                                         r"frozen arrays differ\)\. Load the base weights"):
        run(6, base=other, ckpt_path=saved, save=False)
    with pytest.raises(ValueError, match=r"holds only the trained parameters .*resumes a fit"):
        Classifier.load_from_checkpoint(saved)
    with pytest.raises(ValueError, match=r"ModelCheckpoint\(weights=...\) must be 'all' .*got 'adapters'"):
        fj.ModelCheckpoint(weights="adapters")
