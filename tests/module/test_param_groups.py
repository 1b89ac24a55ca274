"""`fj.param_groups`: rates and weight decay per group by name pattern, as torch's param groups
train; a frozen group holds no optimizer state, and an unfreeze of `BackboneFinetuning` on top
compiles nothing again."""

import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from helpers import count_compiles, quiet_trainer

import fitjax as fj

_RNG = np.random.default_rng(0)
X, Y = _RNG.normal(size=(16, 4)).astype(np.float32), _RNG.normal(size=(16, 1)).astype(np.float32)
STEM, BACKBONE, HEAD = ((_RNG.normal(size=s) * 0.5).astype(np.float32) for s in ((4, 4), (4, 3), (3, 1)))


class Net(nn.Module):
    def setup(self):
        fixed = lambda w: dict(kernel_init=lambda *_: jnp.asarray(w), bias_init=nn.initializers.zeros)  # noqa: E731
        self.stem, self.backbone, self.head = nn.Dense(4, **fixed(STEM)), nn.Dense(3, **fixed(BACKBONE)), nn.Dense(
            1, **fixed(HEAD))

    def __call__(self, x):
        return self.head(jnp.tanh(self.backbone(jnp.tanh(self.stem(x)))))


class Grouped(fj.LitModule):
    def __init__(self, tx):
        super().__init__()
        self.model, self.tx = Net(), tx

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return self.tx


def run(tx, **trainer_args):
    module = Grouped(tx)
    trainer = quiet_trainer(strategy="single", **trainer_args)
    trainer.fit(module, fj.DataLoader({"x": X, "y": Y}, batch_size=4))
    return trainer


def test_rates_and_weight_decay_per_group_train_as_torch_param_groups_and_a_frozen_group_stays():
    # clipping: the norm is the trained groups' (the frozen one has no gradient, as in torch)
    trainer = run(fj.param_groups({
        r"stem\..*": None,
        r"backbone\..*": optax.chain(optax.add_decayed_weights(0.1), optax.sgd(0.01)),
        r"head\..*": optax.sgd(0.1),
    }), max_steps=4, gradient_clip_val=0.05)
    params = jax.device_get(trainer.state.params)

    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)]
    for layer, w in zip(layers, (STEM, BACKBONE, HEAD)):
        layer.weight.data, layer.bias.data = torch.from_numpy(w.T.copy()), torch.zeros(w.shape[1])
    stem, backbone, head = layers
    stem.requires_grad_(False)
    sgd = torch.optim.SGD([{"params": backbone.parameters(), "lr": 0.01, "weight_decay": 0.1},
                           {"params": head.parameters(), "lr": 0.1}])
    for i in range(0, 16, 4):
        x, y = torch.from_numpy(X[i:i + 4]), torch.from_numpy(Y[i:i + 4])
        sgd.zero_grad()
        ((head(torch.tanh(backbone(torch.tanh(stem(x))))) - y) ** 2).mean().backward()
        assert torch.nn.utils.clip_grad_norm_([*backbone.parameters(), *head.parameters()], 0.05) > 0.05
        sgd.step()
    for name, layer in (("backbone", backbone), ("head", head)):
        np.testing.assert_allclose(params[name]["kernel"], layer.weight.detach().numpy().T, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(params[name]["bias"], layer.bias.detach().numpy(), rtol=1e-5, atol=1e-7)
    assert np.array_equal(params["stem"]["kernel"], STEM) and not params["stem"]["bias"].any()


def test_a_frozen_group_holds_no_optimizer_state_and_an_unfreeze_on_top_compiles_once():
    groups = fj.param_groups({r"stem\..*": None, r"head\..*": optax.adam(0.1)}, default=optax.adam(0.01))
    summary = fj.RichModelSummary(file=io.StringIO())
    with count_compiles() as counts:
        trainer = run(groups, max_epochs=2, callbacks=[fj.BackboneFinetuning(unfreeze_backbone_at_epoch=1), summary],
                      enable_model_summary=True)
    assert counts["train_step"] == 1
    # the summary counts what the optimizer trains (BackboneFinetuning unfreezes the backbone later)
    assert (summary.summary.trainable_count, summary.summary.other_count) == (3 * 4 + 3 + 3 + 1, 4 * 4 + 4)
    assert {r.collection for r in summary.summary.rows if r.module == "stem"} == {"frozen"}
    assert summary.summary.frozen_count == 4 * 4 + 4  # the stem's kernel and bias, said as frozen
    printed = summary.console.file.getvalue()
    assert "20        Frozen params (80 B)" in printed and "Other state (" not in printed, printed
    params, opt_state = jax.device_get((trainer.state.params, trainer.state.opt_state))
    assert np.array_equal(params["stem"]["kernel"], STEM)
    trained = sum(a.nbytes for name in ("backbone", "head") for a in jax.tree.leaves(params[name]))
    state_bytes = sum(np.asarray(a).nbytes for a in jax.tree.leaves(opt_state))
    assert trained * 2 <= state_bytes <= trained * 2 + 2 * 4  # Adam's two moments and a step count per group
    assert not np.array_equal(params["backbone"]["kernel"], BACKBONE)  # unfrozen at epoch 1


def test_a_parameter_no_pattern_names_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"the parameter 'stem.bias' matches none of the patterns "
                                         r"\['stem\\\\.kernel', 'backbone\\\\..\*', 'head\\\\..\*'\]"):
        run(fj.param_groups({r"stem\.kernel": None, r"backbone\..*": optax.sgd(0.1), r"head\..*": optax.sgd(0.1)}),
            max_steps=1)
    with pytest.raises(TypeError, match=r"param_groups\(groups=\{'head': ...\}\) must be an optax transformation"):
        fj.param_groups({"head": 0.1})
