"""Adam with bfloat16 and 8-bit moments: plain Adam's numbers within a band, a half and about a
quarter of its state bytes (read from the real state and from `fj.plan`), exact resume, FSDP."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import LossHistory, assert_trees_close, quiet_trainer, regression_data

import fitjax as fj
from fitjax.optim import _adam, _blockwise

pytestmark = pytest.mark.usefixtures("compile_cache")  # tests/conftest.py

DATA = regression_data(n=96)  # 3 batches of 32 an epoch
NARROW = ("bfloat16", "int8")


class Wide(fj.LitModule):
    """An MLP whose 128x128 kernel is large enough to be stored 8-bit (the others stay float32)."""

    def __init__(self, moments: str = "float32"):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential([nn.Dense(128), nn.relu, nn.Dense(128), nn.relu, nn.Dense(1)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return fj.optim.adamw(3e-3, weight_decay=1e-4, moments=self.hparams.moments)


def _loader():
    return fj.DataLoader(DATA, batch_size=32, shuffle=True, seed=3)


def _nbytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def test_a_wrong_option_names_the_argument_and_the_values():
    with pytest.raises(ValueError, match=r"moments='fp8' is not one of 'float32', 'bfloat16', 'int8'"):
        fj.optim.adamw(1e-3, moments="fp8")
    with pytest.raises(ValueError, match=r"block_size=0 must be a positive int"):
        fj.optim.scale_by_adam(moments="int8", block_size=0)


def test_float32_is_optax_adamw_bitwise():
    params = {"w": jnp.linspace(-1, 1, 24).reshape(4, 6)}
    grads = {"w": jnp.cos(params["w"] * 3)}
    ours, theirs = fj.optim.adamw(1e-2, weight_decay=0.1), optax.adamw(1e-2, weight_decay=0.1)
    a, _ = ours.update(grads, ours.init(params), params)
    b, _ = theirs.update(grads, theirs.init(params), params)
    assert_trees_close(a, b, rtol=0, atol=0)


def test_state_bytes_are_a_half_and_about_a_quarter_of_float32_adams():
    params = {"kernel": jnp.zeros((512, 1000)), "bias": jnp.zeros(1000)}  # last dim: 4 blocks, padded
    full = _nbytes(fj.optim.adam(1e-3).init(params))
    half = fj.optim.adam(1e-3, moments="bfloat16").init(params)
    eight = fj.optim.adam(1e-3, moments="int8").init(params)
    assert _nbytes(half) == full // 2 + 2  # the int32 count stays
    assert {leaf.dtype for leaf in jax.tree.leaves(half[0].mu)} == {jnp.dtype(jnp.bfloat16)}
    # kernel: 1 + 1 bytes a value, plus 2 x 4 bytes per 256-value block; the bias keeps float32
    assert 0.25 < _nbytes(eight) / full < 0.26
    assert eight[0].mu["kernel"].shape == (512, 1000) and eight[0].mu["kernel"].dtype == jnp.int8
    assert eight[0].mu_absmax["kernel"]["absmax"].shape == (512, 4)
    assert eight[0].mu["bias"].dtype == jnp.float32


def test_8bit_codes_round_trip_within_their_resolution_and_keep_small_values():
    x = jax.random.normal(jax.random.key(0), (64, 300)) * jnp.logspace(-6, 0, 300)  # 6 decades a row
    key = jax.random.key(1)
    codes, absmax = _blockwise.quantize_mu(x, key, 256)
    back = _blockwise.dequantize_mu(codes, absmax, 256)
    # sqrt map: a value's error is under 2 steps of 1/127 in sqrt space around it
    top = jnp.max(jnp.abs(x))  # any block's absmax is at most this
    bound = (2 * jnp.sqrt(jnp.abs(x) / top) / 127 + 1 / 127**2) * top
    assert bool(jnp.all(jnp.abs(back - x) <= bound))
    nu = jnp.square(x)
    codes, absmax = _blockwise.quantize_nu(nu, key, 256)
    back = _blockwise.dequantize_nu(codes, absmax, 256)
    assert bool(jnp.all((back > 0) == (nu > 0)))  # no non-zero nu stored as 0 (an update / eps)
    r, top = jnp.abs(x), jnp.max(jnp.abs(x))  # nu as sqrt(nu) in the sqrt map: 255 steps
    assert bool(jnp.all(jnp.abs(jnp.sqrt(back) - r) <= (2 * jnp.sqrt(r / top) / 255 + 1 / 255**2) * top))


def test_8bit_rounding_draws_one_word_for_both_moments_and_each_piece_draws_its_rows():
    key, shape = jax.random.key(3), (6, 2, 256)  # 6 rows of 2 blocks
    rows = _blockwise.all_rows((6,))
    high, low = _blockwise.row_uniform_pair(key, rows, shape)
    for half in (high, low):  # 16-bit uniforms in [0, 1)
        assert half.shape == shape and bool(jnp.all((half >= 0) & (half < 1)))
        np.testing.assert_array_equal(half * 2**16, jnp.floor(half * 2**16))
        assert abs(float(jnp.mean(half)) - 0.5) < 0.02
    assert abs(float(jnp.corrcoef(high.ravel(), low.ravel())[0, 1])) < 0.05  # the word's halves: independent
    piece = _blockwise.row_uniform_pair(key, rows[2:4], (2, 2, 256))  # rows 2-3 alone draw what the whole did
    np.testing.assert_array_equal(piece[0], high[2:4])
    np.testing.assert_array_equal(piece[1], low[2:4])


@pytest.fixture(scope="module")
def float32_run():
    history = LossHistory()
    quiet_trainer(max_epochs=8, callbacks=[history]).fit(Wide(), _loader())
    return history.losses


# The band, measured on this model (24 steps of AdamW at 3e-3, loss 10.8 -> 0.30): the largest
# relative difference of a step's loss from float32 Adam's was 0.08% (bfloat16) and 0.93% (int8,
# one 32-bit word rounding both moments; 0.8% with a word each, 1.4% with one key per leaf for the
# rounding bits, before they were drawn per row).
BAND = {"bfloat16": 0.01, "int8": 0.05}


@pytest.mark.parametrize("moments", NARROW)
def test_loss_curve_stays_within_the_band_of_float32_adam(float32_run, moments):
    history = LossHistory()
    quiet_trainer(max_epochs=8, callbacks=[history]).fit(Wide(moments), _loader())
    np.testing.assert_allclose(history.losses, float32_run, rtol=BAND[moments])
    assert history.losses[-1] < 0.1 * history.losses[0]


@pytest.mark.parametrize("moments", NARROW)
def test_an_interrupted_fit_resumes_exactly(tmp_path, moments):
    full = LossHistory()
    trainer = quiet_trainer(max_epochs=4, callbacks=[full])
    full_module = Wide(moments)
    trainer.fit(full_module, _loader())

    first, second = LossHistory(), LossHistory()
    quiet_trainer(max_epochs=2, enable_checkpointing=True, callbacks=[
        first, fj.ModelCheckpoint(tmp_path)]).fit(Wide(moments), _loader())
    resumed = quiet_trainer(max_epochs=4, enable_checkpointing=True,
                            callbacks=[second, fj.ModelCheckpoint(tmp_path)])
    module = Wide(moments)
    resumed.fit(module, _loader(), ckpt_path="last")
    assert first.losses + second.losses == full.losses
    assert_trees_close(module.variables, full_module.variables, rtol=0, atol=0)
    assert_trees_close(resumed.state.opt_state, trainer.state.opt_state, rtol=0, atol=0)


def test_8bit_state_shards_like_the_parameters_under_fsdp():
    trainer = quiet_trainer(max_steps=2, strategy="fsdp")
    trainer.fit(Wide("int8"), _loader())
    kernel = trainer.state.params["layers_2"]["kernel"]
    codes = trainer.state.opt_state[0].mu["layers_2"]["kernel"]
    assert codes.dtype == jnp.int8 and len(kernel.sharding.device_set) == 8
    assert codes.sharding.is_equivalent_to(kernel.sharding, codes.ndim)


def test_fj_plan_reports_the_smaller_optimizer_state():
    optimizer = {m: fj.plan(Wide(m), _loader(), strategy="single").recommended.memory["optimizer"]
                 for m in ("float32", *NARROW)}
    assert optimizer["bfloat16"] / optimizer["float32"] == pytest.approx(0.5, abs=0.001)
    # the 128x128 kernel is 8-bit; the small kernels and biases keep float32 moments
    assert optimizer["int8"] < 0.5 * optimizer["float32"]


@pytest.mark.parametrize("moments", NARROW)
def test_a_schedule_drives_the_rate_through_inject_hyperparams(moments):
    # what `{"optimizer": fj.optim.adamw, "lr_scheduler": schedule}` builds, and lr_find's route
    schedule = optax.linear_schedule(1e-2, 0.0, 4)
    tx = optax.inject_hyperparams(fj.optim.adamw)(learning_rate=schedule, moments=moments)
    params = {"w": jnp.ones((32, 256))}
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(2):
        _, state = update(params, state, params)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(float(schedule(1)))  # the 2nd step's
    assert state.inner_state[0].mu["w"].dtype == (jnp.int8 if moments == "int8" else jnp.bfloat16)


def _int8(chunk_bytes: int = _blockwise.CHUNK_BYTES):
    return _adam._scale_by_adam_8bit(0.9, 0.999, 1e-8, 0.0, 256, 0, chunk_bytes=chunk_bytes)


# cut: the last leading axis in 8 groups (a), the middle one (b), the first, a layer at a time (c)
PIECES = {"a": (256, 64), "b": (4, 24, 64), "c": (8, 16, 64), "bias": (8,)}


def _updates(tx, params, shardings=None, steps=2):
    state, out = tx.init(params), []
    update = jax.jit(tx.update, in_shardings=(shardings, None) if shardings else None)
    for i in range(steps):
        grads = jax.tree.map(lambda p: jnp.cos(p * (i + 2)) * jnp.logspace(-4, 0, p.shape[-1]), params)
        updates, state = update(grads, state)
        out.append(updates)
    return out, state


def test_8bit_update_in_pieces_equals_one_piece_bitwise():
    keys = jax.random.split(jax.random.key(0), len(PIECES))
    params = {k: jax.random.normal(key, s) for key, (k, s) in zip(keys, PIECES.items())}
    cuts = {k: _blockwise.pieces(s[:-1], 4 * max(s[-1], 64), 4096) for k, s in PIECES.items()}
    assert cuts == {"a": (0, 8, 16), "b": (1, 1, 6), "c": (0, 1, 8), "bias": None}
    assert_trees_close(_updates(_int8(4096), params), _updates(_int8(), params), rtol=0, atol=0)


def test_8bit_update_in_pieces_of_sharded_leaves_equals_one_piece_bitwise():
    keys = jax.random.split(jax.random.key(0), len(PIECES))
    params = {k: jax.random.normal(key, s) for key, (k, s) in zip(keys, PIECES.items())}
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    P = jax.sharding.PartitionSpec
    specs = {"a": P("fsdp"), "b": P(None, "fsdp"), "c": P(None, None, "fsdp"), "bias": P()}
    shardings = {k: jax.sharding.NamedSharding(mesh, spec) for k, spec in specs.items()}
    sharded = _updates(_int8(4096), jax.device_put(params, shardings), shardings)
    assert len(sharded[0][0]["a"].sharding.device_set) == 8
    assert_trees_close(sharded, _updates(_int8(), params), rtol=0, atol=0)


def test_8bit_update_in_pieces_holds_a_piece_of_temporaries():
    params = {"w": jax.ShapeDtypeStruct((4096, 1024), jnp.float32)}  # 16 MiB

    def temp_bytes(tx):
        state = jax.eval_shape(tx.init, params)
        return jax.jit(tx.update).lower(params, state).compile().memory_analysis().temp_size_in_bytes

    # measured on CPU: 32 MiB in one piece (two float32 copies of the leaf), 4 MiB in 1 MiB pieces
    assert temp_bytes(_int8(2**20)) < 0.2 * temp_bytes(_int8())
