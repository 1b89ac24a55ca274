"""Out of memory, explained: XLA's figures read from its own message, and a budget no strategy
fits answered at compile time with the cheapest change the planner finds that fits."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import quiet_trainer

import fitjax as fj
from fitjax import planner
from fitjax.planner import OutOfMemoryError, PlannedStrategy


class Tall(fj.LitModule):
    """A wide hidden layer on many rows: its activations, not its 0.5 MiB of weights, fill memory."""

    def __init__(self):
        super().__init__()
        self.model = nn.Sequential([nn.Dense(1024), nn.relu, nn.Dense(1)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.adam(1e-3)


def data(rows=256):
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(rows, 64)).astype(np.float32), "y": rng.normal(size=(rows, 1)).astype(np.float32)}


def real_xla_refusal() -> Exception:
    """XLA:TPU's own refusal of a 24 GiB program for one v5e chip, compiled deviceless here."""
    target = planner.resolve_target("tpu-v5e-1", jax.devices())
    on_chip = jax.sharding.SingleDeviceSharding(target.devices[0])
    outer = jax.jit(lambda x: x[:, None] * x[None, :], in_shardings=on_chip, out_shardings=on_chip)
    with planner.quiet_stderr(), pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as refused:
        outer.lower(jax.ShapeDtypeStruct((80_000,), jnp.float32)).compile()
    return refused.value


def test_the_message_says_xlas_figures_from_its_own_refusal():
    text = str(real_xla_refusal())
    needed, available = planner.xla_figures(text)
    assert needed == int(23.84 * 2**30) and available == int(15.75 * 2**30)
    # the figures of XLA's other sentences: the runtime's (the chip run) and XLA:GPU's
    assert planner.xla_figures("RESOURCE_EXHAUSTED: Attempting to reserve 8.95G at the bottom of memory. That was "
                               "not possible. There are 6.43G free, 0B reserved, and 6.43G reservable.") == (
        int(8.95 * 2**30), int(6.43 * 2**30))
    assert planner.xla_figures("Out of memory while trying to allocate 1073741824 bytes.") == (2**30, None)
    # a device stating no memory (a CPU) is measured against XLA's figure of what there is
    module, batch = Tall(), data()
    trainer = quiet_trainer(devices=1)
    target = planner.resolve_target("local", trainer.devices)
    error = planner.out_of_memory_error(module, batch, target, strategy=trainer.strategy,
                                        options=trainer.step_options, headroom=0.1, xla_text=text)
    message = str(error)
    assert message.startswith("The train step does not fit in memory: it needs 23.8 GiB per device and 1 × cpu has "
                              "15.8 GiB (less 10% headroom: 14.2 GiB); XLA said: RESOURCE_EXHAUSTED: ")
    assert "The step as configured fits by XLA's memory analysis" in message  # this small step: held elsewhere
    assert error.needed_bytes == needed and error.available_bytes == available and error.change is None


def test_a_budget_no_strategy_or_remat_fits_is_refused_at_compile_with_the_micro_batches_that_fit():
    module, batch = Tall(), data()
    trainer = quiet_trainer(devices=1, max_steps=1)
    plan = trainer.plan(module, fj.DataLoader(batch, batch_size=256), sweep={"accumulate": [1, 4],
                                                                            "remat": ["none", "full"]})
    peak = {(m.accumulate, m.remat): m.memory["peak"] for m in plan.candidates}
    assert peak[4, "none"] < min(peak[1, "none"], peak[1, "full"])  # the micro-batches hold less
    budget = (peak[4, "none"] + min(peak[1, "none"], peak[1, "full"], 2 * peak[4, "none"])) // 2
    trainer = quiet_trainer(devices=1, max_steps=1, strategy=PlannedStrategy(memory_bytes=budget, headroom=0.0))
    with pytest.raises(OutOfMemoryError) as refused:
        trainer.fit(module, fj.DataLoader(batch, batch_size=256))
    message, error = str(refused.value), refused.value
    assert f"is given {planner.human_bytes(budget)}" in message and error.available_bytes == budget
    assert error.needed_bytes == min(peak[1, "none"], peak[1, "full"])  # the smallest the strategies reached
    assert "The cheapest change that fits: Trainer(accumulate_grad_batches=" in message
    assert "(the same 256 rows per optimizer step)" in message and trainer.global_step == 0
    k = int(error.change.split("accumulate_grad_batches=")[1].split(")")[0])
    assert k in (2, 4) and f"with batches of {256 // k} rows, not 256" in error.change


def test_a_budget_nothing_fits_offers_no_precision_the_step_already_uses():
    # bfloat16 weights already: the advice must not be bf16-mixed (float32 weights, more memory)
    trainer = quiet_trainer(devices=1, max_steps=1, precision="bf16-true",
                            strategy=PlannedStrategy(memory_bytes=64 * 1024, headroom=0.0))
    with pytest.raises(OutOfMemoryError, match="No strategy, micro-batch size or remat fits") as refused:
        trainer.fit(Tall(), fj.DataLoader(data(), batch_size=256))
    message = str(refused.value)
    assert "Use more devices, a smaller model or batch." in message and "precision=" not in message
    assert refused.value.change is None


class Refuse(fj.Callback):
    """Raises XLA's real refusal (`real_xla_refusal`'s) as the first step starts: a fit whose step
    ran out of memory, on a CPU that never does."""

    def __init__(self, error: Exception):
        self.error = error

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        raise self.error


def test_a_fit_that_runs_out_of_memory_ends_with_the_explanation_and_xlas_error_as_its_cause():
    error = real_xla_refusal()
    trainer = quiet_trainer(devices=1, max_steps=1, callbacks=[Refuse(error)])
    with pytest.raises(OutOfMemoryError, match=r"it needs 23.8 GiB per device and 1 × cpu has 15.8 GiB") as raised:
        trainer.fit(Tall(), fj.DataLoader(data(), batch_size=256))
    assert raised.value.__cause__ is error



class Wide(fj.LitModule):
    """Three 512-wide layers on 8 rows, trained by Adam: its moments (6 MiB in float32), not the
    activations, are what a tight budget cannot hold."""

    def __init__(self, moments: str = "float32"):
        super().__init__()
        self.moments = moments
        self.model = nn.Sequential([nn.Dense(512), nn.relu, nn.Dense(512), nn.relu, nn.Dense(512), nn.relu,
                                    nn.Dense(1)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return fj.optim.adam(1e-3, moments=self.moments)  # "float32": optax.adam itself


def test_a_budget_adams_moments_overflow_is_answered_with_narrower_moments():
    """On a v5e chip (compiled deviceless): each storage's compiled peak is at most float32's less
    what the planner says the narrower moments save, and a budget between them is answered with them."""
    batch = {"x": jax.ShapeDtypeStruct((8, 512), jnp.float32), "y": jax.ShapeDtypeStruct((8, 1), jnp.float32)}
    planned = {m: fj.plan(Wide(m), batch, target="tpu-v5e-1", devices=1).candidates[0]
               for m in ("float32", "bfloat16", "int8")}
    peak = {m: p.memory["peak"] for m, p in planned.items()}
    wide = planned["float32"].moments
    assert wide["storage"] == "float32" and wide["bytes"] == wide["float32"] == 2 * planned["float32"].memory["params"]
    for storage in ("bfloat16", "int8"):  # what float32's plan says each storage takes is what it takes
        assert wide[storage] == planned[storage].moments["bytes"]
        # the estimate, float32's peak less that saving, bounds the compiled peak from above: the
        # narrow moments' update holds less than float32's (measured here: bfloat16 10% under the
        # estimate, int8 41%)
        assert peak[storage] <= peak["float32"] - (wide["bytes"] - wide[storage])
    assert peak["int8"] < peak["bfloat16"] < peak["float32"]

    def refused(budget):
        target = planner.resolve_target("tpu-v5e-1", jax.devices(), memory_bytes=budget)
        trainer = quiet_trainer(devices=1)
        return planner.out_of_memory_error(Wide(), batch, target, strategy=trainer.strategy,
                                           options=trainer.step_options, headroom=0.0, smallest=planned["float32"])

    saved = wide["bytes"] - wide["bfloat16"]
    error = refused(peak["float32"] - saved // 2)  # between float32's peak and bfloat16's estimate
    assert error.change == ("`configure_optimizer` returning `fj.optim.adamw(..., moments='bfloat16')` (Adam's "
                            "moments stored in bfloat16 between steps)")
    assert "(estimated: as configured's compiled peak less what the narrower moments save)" in str(error)
    error = refused(peak["float32"] - saved - (wide["bfloat16"] - wide["int8"]) // 2)
    assert "moments='int8'" in error.change
