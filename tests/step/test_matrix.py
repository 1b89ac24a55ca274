"""Every step option on every strategy, with host batches and with batches kept on the device.

Rows: plain, bf16-mixed, 16-mixed, accumulate 2, clip 1.0, steps_per_execution 4, manual
optimization, and `fj.TokenLoss` with accumulation (micro-batches holding ragged token counts). Columns: single, dp, fsdp (every parameter sharded) x host batches, a
`fj.DataLoader` kept on the devices. Each cell is fitted once (two epochs) and checks

(a) the same numbers as the plain step where the math is the same: bitwise on CPU for clipping
    below the threshold, several steps per call, manual optimization with independent groups and
    device vs host batches; a stated tolerance where it is not the same computation;
(b) a run stopped at step 5 (mid-epoch) and resumed with `ckpt_path="last"` ends with the same
    parameters and per-call loss curve, bitwise, as the uninterrupted run;
(c) one compilation of each train step variant per shape.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from helpers import HostBatches, LossHistory, assert_trees_close, count_compiles, quiet_trainer

import fitjax as fj
from fitjax.strategies import FSDP, DataParallel

N, BATCH, EPOCHS, STOP_AT = 64, 8, 2, 5


class Towers(nn.Module):
    """Two independent towers: group "a" fits y, group "b" fits -y (manual optimization updates
    each by its own loss; their sum gives the plain step the same gradients)."""

    @nn.compact
    def __call__(self, x):
        return {"a": TwoTowersPart(name="a")(x), "b": TwoTowersPart(name="b")(x)}


class TwoTowersPart(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.tanh(nn.Dense(8)(x)))


def _losses(out, batch):
    return {"a": ((out["a"] - batch["y"]) ** 2).mean(), "b": ((out["b"] + batch["y"]) ** 2).mean()}


class Plain(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = Towers()

    def loss(self, model, batch):
        losses = _losses(model(batch["x"]), batch)
        return losses["a"] + losses["b"]

    def configure_optimizer(self):
        return optax.sgd(0.05, momentum=0.9)


class Manual(fj.LitModule):
    """Lightning-style manual optimization: one optimizer per group."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.model = Towers()

    def training_step(self, batch, batch_idx):
        return _losses(self.model(batch["x"]), batch)

    def configure_optimizers(self):
        return {"a": optax.sgd(0.05, momentum=0.9), "b": optax.sgd(0.05, momentum=0.9)}


class Tokens(Plain):
    """The loss as `fj.TokenLoss` over the rows a mask keeps (a ragged count per micro-batch)."""

    def loss(self, model, batch):
        out, mask = model(batch["x"]), (batch["x"][:, 0] > 0).astype(np.float32)
        per_row = (((out["a"] - batch["y"]) ** 2) + ((out["b"] + batch["y"]) ** 2))[:, 0]
        return fj.TokenLoss(sum=(per_row * mask).sum(), count=mask.sum())


ROWS = {
    "plain": {},
    "bf16-mixed": {"precision": "bf16-mixed"},
    "16-mixed": {"precision": "16-mixed"},
    "accumulate 2": {"accumulate_grad_batches": 2},
    "clip 1.0": {"gradient_clip_val": 1.0},
    "steps_per_execution 4": {"steps_per_execution": 4},
    "manual": {},
    "token loss": {},  # the reference of the next row
    "token loss, accumulate 2": {"accumulate_grad_batches": 2},
}
MODULES = {"manual": Manual, "token loss": Tokens, "token loss, accumulate 2": Tokens}
STRATEGIES = {"single": lambda: "single", "dp": lambda: "dp", "fsdp": lambda: FSDP(min_size_to_shard=0),
              # ZeRO-1: every optimizer-state matrix sharded over the 8 devices, parameters replicated
              "zero1": lambda: DataParallel(zero1=True, min_size_to_shard=0)}

# (a): the tolerance against the plain cell of the same strategy and data, and why
SAME_MATH = {
    "plain": (0, 0),
    "clip 1.0": (0, 0),  # every gradient norm here is below 1: clipping is the identity
    "steps_per_execution 4": (0, 0),  # the same step, scanned 4 times in one program
    "manual": (0, 0),  # the groups' losses are independent: each group's gradient is the plain one
    # bfloat16 keeps 8 bits of mantissa: ~0.4% per product, over 16 steps
    "bf16-mixed": (5e-2, 5e-2),
    # float16 keeps 11 bits: ~0.05% per product
    "16-mixed": (1e-2, 1e-2),
}


def data():
    rng = np.random.default_rng(0)
    # small inputs and targets: every gradient's global norm stays under 1 (clip 1.0 does not bite)
    x = (0.2 * rng.normal(size=(N, 4))).astype(np.float32)
    y = (0.1 * np.tanh(5 * x @ rng.normal(size=(4, 1)))).astype(np.float32)
    return {"x": x, "y": y}


def _loader(where: str, batch_size: int = BATCH):
    loader = fj.DataLoader(data(), batch_size=batch_size, shuffle=True, seed=1)
    return loader if where == "device" else HostBatches(loader)


def _fit(row, strategy, where, *, root=None, batch_size=BATCH, ckpt_path=None, **kwargs):
    history = LossHistory()
    callbacks = [history]
    if root is not None:
        callbacks.append(fj.ModelCheckpoint(dirpath=root, save_last=True))
        kwargs["enable_checkpointing"] = True
    trainer = quiet_trainer(strategy=STRATEGIES[strategy](), callbacks=callbacks, **ROWS[row], **kwargs)
    module = MODULES.get(row, Plain)()
    with count_compiles() as compiles:
        trainer.fit(module, _loader(where, batch_size), ckpt_path=ckpt_path)
    return jax.device_get(module.variables[0]), history.losses, compiles, trainer


@functools.cache
def _uninterrupted(row, strategy, where, batch_size=BATCH):
    return _fit(row, strategy, where, batch_size=batch_size, max_epochs=EPOCHS)


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """JAX's persistent compilation cache for this module: the interrupted and the resumed run
    of a cell ask XLA for the programs the uninterrupted run compiled, and get them from disk
    (~1 s of compilation each on 2 cores otherwise). Compilations are still counted: JAX logs
    each compile request, cached or not."""
    from jax._src import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in names}
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


CELLS = [(row, strategy, where) for row in ROWS if not row.startswith("token") for strategy in STRATEGIES
         if strategy != "zero1" for where in ("host", "device")]
# ZeRO-1 changes only where the optimizer state lives: a few rows, host batches, and dp's numbers bitwise
CELLS += [(row, "zero1", "host") for row in ("plain", "accumulate 2", "manual")]
# token-weighted accumulation: 2 micro-batches with ragged token counts = one batch of 16, and
# single's numbers; one cell (tests/step/test_token_loss.py covers single, dp and fsdp)
CELLS += [("token loss, accumulate 2", "fsdp", "host")]


@pytest.mark.parametrize("row, strategy, where", CELLS)
def test_cell(row, strategy, where, tmp_path):
    params, losses, compiles, trainer = _uninterrupted(row, strategy, where)
    calls = len(losses)

    # (c) one compilation per train step variant and shape
    spe, k = ROWS[row].get("steps_per_execution", 1), ROWS[row].get("accumulate_grad_batches", 1)
    assert trainer.global_step == EPOCHS * N // BATCH // k
    assert compiles["train_step"] == 1, dict(compiles)  # the block step or the host step, never both
    assert compiles["gather"] == (1 if where == "device" else 0)  # device blocks of the epoch's order

    # (a) the same numbers as the plain step where the math is the same
    if row.endswith("accumulate 2"):  # 2 micro-batches of 8 = one batch of 16 (summed in another order)
        plain = "token loss" if row.startswith("token") else "plain"
        reference, ref_losses, _, _ = _uninterrupted(plain, strategy, where, batch_size=2 * BATCH)
        assert_trees_close(params, reference, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    elif row != "plain":
        reference, ref_losses, _, _ = _uninterrupted("plain", strategy, where)
        rtol, atol = SAME_MATH[row]
        assert_trees_close(params, reference, rtol=rtol, atol=atol)
        if row == "steps_per_execution 4":
            ref_losses = ref_losses[spe - 1::spe]  # hooks see the last step of each call
        np.testing.assert_allclose(losses, ref_losses, rtol=max(rtol, 0), atol=atol)
    if strategy != "single":  # sharded: the same numbers up to the order of cross-device sums
        single, single_losses, _, _ = _uninterrupted(row, "single", where)
        rtol, atol = max(SAME_MATH.get(row, (0, 0)), (1e-5, 1e-6))  # low precision rounds the sums
        assert_trees_close(params, single, rtol=rtol, atol=atol)
        np.testing.assert_allclose(losses, single_losses, rtol=rtol, atol=atol)
    if strategy == "zero1":  # the update is elementwise: each device's slice of it is dp's
        dp, dp_losses, _, _ = _uninterrupted(row, "dp", where)
        assert_trees_close(params, dp, rtol=0, atol=0)
        assert losses == dp_losses
        opt_state = trainer.state.opt_state
        assert any(leaf.sharding.spec != jax.sharding.PartitionSpec() for leaf in jax.tree.leaves(opt_state))
        assert all(leaf.sharding.spec == jax.sharding.PartitionSpec() for leaf in jax.tree.leaves(trainer.state.params))
    if where == "device":  # the same batches picked on the device: the same program's numbers
        host, host_losses, _, _ = _uninterrupted(row, strategy, "host")
        assert_trees_close(params, host, rtol=0, atol=0)
        assert losses == host_losses

    # (b) stopped at step STOP_AT (mid-epoch), resumed from "last": bitwise the same run
    stop = STOP_AT - STOP_AT % spe if spe > 1 else STOP_AT
    _, first_losses, _, _ = _fit(row, strategy, where, root=tmp_path, max_steps=stop)
    resumed, rest_losses, _, resumed_trainer = _fit(row, strategy, where, root=tmp_path, ckpt_path="last",
                                                    max_epochs=EPOCHS)
    assert resumed_trainer.global_step == trainer.global_step
    assert_trees_close(resumed, params, rtol=0, atol=0)
    assert first_losses + rest_losses == losses
    assert calls == len(losses)
