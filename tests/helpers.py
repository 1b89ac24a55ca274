"""Shared test pieces: one numerics helper, small modules, synthetic data and a digits split."""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import fitjax as fj

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def assert_trees_close(actual, expected, *, rtol=1e-5, atol=1e-6):
    """Every leaf of two pytrees with the same structure agrees to the tolerance."""
    a_leaves, a_def = jax.tree_util.tree_flatten_with_path(jax.device_get(actual))
    e_leaves, e_def = jax.tree_util.tree_flatten_with_path(jax.device_get(expected))
    assert a_def == e_def, f"tree structures differ:\n{a_def}\n{e_def}"
    for (path, a), (_, e) in zip(a_leaves, e_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


def regression_data(n=256, d=8, seed=0):
    """A linear teacher with noise: `{"x": [n, d], "y": [n, 1]}`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, 1)).astype(np.float32)
    y = (x @ w + 0.1 * rng.normal(size=(n, 1))).astype(np.float32)
    return {"x": x, "y": y}


class MLP(nn.Module):
    width: int = 32
    batchnorm: bool = True

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(self.width)(x)
        if self.batchnorm:
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        return nn.Dense(1)(nn.relu(x))


class FixedLinear(nn.Module):
    """One Dense(3 -> 1) layer with fixed starting weights: the net the comparisons with a Lightning
    run start from (the torch side sets the same numbers)."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1, kernel_init=lambda *_: jnp.asarray([[0.125], [-0.25], [0.375]]),
                        bias_init=lambda *_: jnp.asarray([0.0625]))(x)


class FixedLinearFit(fj.LitModule):
    """Squared error of `FixedLinear` trained with SGD(0.1, momentum 0.9): the module the Lightning
    comparisons (accumulation schedule, precisions) run on both sides, on `fixed_linear_data`."""

    def __init__(self):
        super().__init__()
        self.model = FixedLinear()

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def predict_step(self, model, batch):
        return model(batch["x"])

    def configure_optimizer(self):
        return optax.sgd(0.1, momentum=0.9)


def fixed_linear_data(n=16):
    """The data of those comparisons: `{"x": [n, 3], "y": [n, 1]}` from sines and cosines."""
    return {"x": np.sin(np.arange(3 * n).reshape(n, 3) * 0.7), "y": np.cos(np.arange(n) * 0.3)[:, None]}


class Regressor(fj.LitModule):
    """MSE regression on `regression_data`, with an `mae` metric."""

    def __init__(self, lr: float = 0.05, batchnorm: bool = True):
        super().__init__()
        self.save_hyperparameters()
        self.model = MLP(batchnorm=batchnorm)

    def loss(self, model, batch):
        pred = model(batch["x"], train=self.training)
        return ((pred - batch["y"]) ** 2).mean(), {"pred": pred}

    def metrics(self, batch, outputs):
        return {"mae": abs(outputs["pred"] - batch["y"]).mean()}

    def predict_step(self, model, batch):
        return model(batch["x"], train=False)

    def configure_optimizer(self):
        return optax.sgd(self.hparams.lr, momentum=0.9)


class DenseRegression(fj.LitModule):
    """The smallest module: one `nn.Dense(1)`, MSE, SGD at 0.1 (no metrics, no state)."""

    def __init__(self):
        super().__init__()
        self.model = nn.Dense(1)

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(0.1)


class LossHistory(fj.Callback):
    """Records each step's loss (fetching it: a per-step sync that tests can afford)."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


class HostBatches:
    """A `fj.DataLoader`'s batches through the generic host path (a wrapper, so the loader's data
    is not kept on the devices); its position is saved and restored like the loader's."""

    def __init__(self, loader: fj.DataLoader):
        self.loader = loader

    def set_epoch(self, epoch):
        self.loader.set_epoch(epoch)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)

    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)


def sigint_as(handler: str, command: list[str]) -> list[str]:
    """`command`, a Python process's (`[sys.executable, ...]`), started with SIGINT's `handler`:
    "SIG_DFL" as a terminal's foreground process has it, whatever the suite was started with (a
    run started in the background, `nohup` or a script's `&`, passes SIGINT on ignored, and Python
    then installs no KeyboardInterrupt handler), or "SIG_IGN" as such a background job has it. A
    small launcher sets it and execs the command (a `preexec_fn` would fork this multithreaded
    process, which JAX warns may deadlock)."""
    assert command[0] == sys.executable and handler in ("SIG_DFL", "SIG_IGN"), (handler, command[:1])
    launcher = (f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{handler}); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    return [sys.executable, "-c", launcher, *command[1:]]


def quiet_trainer(**kwargs) -> fj.Trainer:
    kwargs.setdefault("enable_progress_bar", False)
    kwargs.setdefault("enable_model_summary", False)
    kwargs.setdefault("logger", False)
    kwargs.setdefault("enable_checkpointing", False)
    return fj.Trainer(**kwargs)


@contextlib.contextmanager
def persistent_compile_cache(folder):
    """Inside the block XLA's persistent cache (in `folder`) compiles each program once, for
    test modules whose fits build the same programs again and again."""
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    from jax.experimental.compilation_cache import compilation_cache

    before = {name: getattr(jax.config, name) for name in names}
    for name, value in zip(names, (str(folder), 0, 0)):
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # JAX keeps the folder it opened first until told
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


@contextlib.contextmanager
def count_compiles():
    """Counts XLA compilations per jitted function name inside the block (a Counter): each
    program XLA compiles, whether or not JAX traced and lowered the function anew for it."""
    counts: collections.Counter = collections.Counter()

    class _Handler(logging.Handler):
        def emit(self, record):
            match = re.match(r"Finished XLA compilation of jit\((.+?)\)", record.getMessage())
            if match:
                counts[match.group(1)] += 1

    handler = _Handler(level=logging.DEBUG)
    log = logging.getLogger("jax")
    log.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield counts
    finally:
        log.removeHandler(handler)


def poisoned_data(n=256, d=8, *, loss_poison_at=None, grad_poison_at=None, batch_size=16, seed=0):
    """`regression_data` plus per-row flags that make one batch's loss infinite (`loss_poison`)
    or its gradients NaN with a finite loss (`grad_poison`), for tests of non-finite handling."""
    data = regression_data(n=n, d=d, seed=seed)
    data["loss_poison"] = np.ones((n,), np.float32)
    data["grad_poison"] = np.zeros((n,), np.float32)
    if loss_poison_at is not None:
        data["loss_poison"][loss_poison_at * batch_size:(loss_poison_at + 1) * batch_size] = np.inf
    if grad_poison_at is not None:
        data["grad_poison"][grad_poison_at * batch_size:(grad_poison_at + 1) * batch_size] = 1.0
    return data


class Poisoned(fj.LitModule):
    """MSE regression without BatchNorm, poisoned on the batches `poisoned_data` marks."""

    def __init__(self, lr: float = 0.05, optimizer: str = "sgd"):
        super().__init__()
        self.save_hyperparameters()
        self.model = MLP(batchnorm=False)

    def loss(self, model, batch):
        pred = model(batch["x"], train=self.training)
        mse = ((pred - batch["y"]) ** 2).mean() * batch["loss_poison"].mean()
        # value 0 either way; with grad_poison = 1 its gradient is inf - inf = NaN (sqrt'(0) = inf)
        slack = 1.0 - batch["grad_poison"].mean()
        return mse + jnp.sqrt(jnp.sum(pred - pred) + slack) - jnp.sqrt(slack)

    def configure_optimizer(self):
        if self.hparams.optimizer == "adam":
            return optax.adam(self.hparams.lr)
        return optax.sgd(self.hparams.lr)


VOCAB = 40  # TinyLM's


class TinyLM(nn.Module):
    """A two-layer causal LM with `Trainer.generate`'s contract: `init_cache`, and a call that writes
    keys and values at `positions` and masks by positions and segment ids."""

    width: int = 32
    heads: int = 4
    layers: int = 2
    context: int = 128

    @property
    def max_positions(self):  # learned positions: `Trainer.generate` refuses prompts past the table
        return self.context

    def init_cache(self, batch, max_length, dtype):
        shape = (batch, max_length, self.heads, self.width // self.heads)
        return {"segment_ids": jnp.zeros((batch, max_length), jnp.int32),
                "layers": [{"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)}
                           for _ in range(self.layers)]}

    @nn.compact
    def __call__(self, tokens, *, positions=None, segment_ids=None, cache=None):
        batch, length = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
        if segment_ids is None:
            segment_ids = jnp.ones_like(tokens)
        x = nn.Embed(VOCAB, self.width)(tokens) + nn.Embed(self.context, self.width)(positions)
        rows = jnp.arange(batch)[:, None]
        if cache is not None:
            kv_segments = cache["segment_ids"].at[rows, positions].set(segment_ids)
            kv_positions = jnp.broadcast_to(jnp.arange(kv_segments.shape[1]), kv_segments.shape)
            new_cache = {"segment_ids": kv_segments, "layers": []}
        for i in range(self.layers):
            h = nn.LayerNorm()(x)
            q, k, v = (nn.Dense(self.width, name=f"{n}_{i}")(h).reshape(batch, length, self.heads, -1) for n in "qkv")
            if cache is None:
                out = fj.nn.attention(q, k, v, positions=(positions, positions), segment_ids=segment_ids)
            else:
                layer = cache["layers"][i]
                k = layer["key"].at[rows, positions].set(k.astype(layer["key"].dtype))
                v = layer["value"].at[rows, positions].set(v.astype(layer["value"].dtype))
                new_cache["layers"].append({"key": k, "value": v})
                out = fj.nn.attention(q, k, v, positions=(positions, kv_positions),
                                      segment_ids=(segment_ids, kv_segments))
            x = x + nn.Dense(self.width)(out.reshape(batch, length, -1))
            x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(2 * self.width)(nn.LayerNorm()(x))))
        logits = nn.Dense(VOCAB)(nn.LayerNorm()(x))
        return logits if cache is None else (logits, new_cache)


class TinyLMModule(fj.LitModule):
    def __init__(self):
        super().__init__()
        self.model = TinyLM()

    def loss(self, model, batch):
        logits = model(batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    def configure_optimizer(self):
        return optax.adam(1e-2)


def perturbed_transformers_model(config):
    """A random `transformers` causal LM of `config` (seeded) with every weight moved off its
    initial value (biases and Gemma's norms start at zero), in eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def word_tokenizer(folder, words):
    """A Hugging Face tokenizer made here, nothing downloaded: one id per word of `words` (and
    punctuation), BOS/EOS/pad and a chat template whose turns are `<|role|> content <|end|>`;
    saved with `save_pretrained` into `folder`, which is returned."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
    vocab = {word: i for i, word in enumerate(dict.fromkeys(specials + sorted(set(words))))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>", additional_special_tokens=specials[4:])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


class Rows(fj.loggers.Logger):
    """A logger keeping every row it receives, in order (`rows`: (step, metrics) pairs)."""

    name, version = "rows", 0

    def __init__(self):
        self.rows: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        pass

    def steps_of(self, key):
        return [step for step, row in self.rows if key in row]
