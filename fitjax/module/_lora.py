"""LoRA through Google's qwix: low-rank adapters beside the weights a rule names, trained alone.

`LitModule.apply_lora(...)` wraps the module's flax model with `qwix.apply_lora_to_model`: every
matmul of a layer whose path matches `targets` gets `x @ A @ B * alpha / rank` added, with `A`
(`<weight>_lora_a`, He-uniform) and `B` (`<weight>_lora_b`, zeros, so training starts from the
base model exactly) created beside the weight. fitjax then trains the adapters only: the
optimizer is the module's, over the adapters; the rest is frozen (`fj.param_groups` with None:
no gradient, no update, no state).

QLoRA (`quantize="int8"`, `"nf4"`, ... : qwix's `weight_qtype`): the adapted weights are held
quantized, a qwix `WithAux(QArray)` among the parameters (an integer `qvalue` and a float
`scale`). Weights from outside are read as floats into the weights' own shape and sharding and
quantized there (`place_quantized`); the step never differentiates them (integers have no
gradient: the frozen part is a constant of the step).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fitjax._optional import require
from fitjax._typing import PyTree
from fitjax.module._param_groups import param_groups
from fitjax.module._weights import flat_arrays

__all__ = ["LoraSpec"]

ADAPTER = re.compile(r".*_lora_[ab]")
QTYPES = ("int8", "int4", "nf4", "float8_e4m3fn")  # qwix weight types QLoRA offers


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """What `apply_lora` was given: which layers (a regex on their module path), the rank, the
    scale's alpha (`alpha / rank` multiplies the adapters' output) and the adapters' input dropout."""

    targets: str
    rank: int
    alpha: float
    dropout: float
    quantize: str | None = None  # QLoRA: qwix's weight_qtype for the adapted weights

    @classmethod
    def make(cls, *, targets: str, rank: int, alpha: float | None, dropout: float, owner: str,
             quantize: str | None = None) -> "LoraSpec":
        where = f"{owner}.apply_lora"
        require("qwix", feature=f"`{where}(...)` (adapters made by Google's qwix)")
        if quantize is not None and quantize not in QTYPES:
            raise ValueError(f"{where}(quantize=...) must be None (LoRA) or one of {list(QTYPES)} (QLoRA: the "
                             f"adapted weights held in that type by qwix); got {quantize!r}.")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"{where}(rank=...) must be a positive int (the adapters' inner size, e.g. 8); "
                             f"got {rank!r}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{where}(dropout=...) must be in [0, 1); got {dropout!r}.")
        try:
            re.compile(targets)
        except (re.error, TypeError) as error:
            raise ValueError(f"{where}(targets=...): {targets!r} is not a regular expression ({error}); it "
                             "matches the layers' module paths, e.g. r'.*(q_proj|v_proj)'.") from None
        return cls(targets, rank, float(2 * rank if alpha is None else alpha), float(dropout), quantize)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def wrap(self, model: Any, example: tuple, owner: str) -> Any:
        """The model with adapters (a copy: the user's model object is left as it was)."""
        import qwix

        provider = qwix.LoraProvider(module_path=self.targets, rank=self.rank, alpha=self.alpha,
                                     dropout=self.dropout, weight_qtype=self.quantize)
        if isinstance(model, nn.Module):
            return qwix.apply_lora_to_model(model, provider)
        if not example:
            raise ValueError(f"{owner}.apply_lora(example_input=...) is needed for an NNX model: qwix runs the "
                             "model once on it to create the adapters (values do not matter, shapes do).")
        return qwix.apply_lora_to_model(model, provider, *example, rngs=nnx.Rngs(0))

    def optimizer(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
        """`tx` over the adapters; the rest frozen, with no optimizer state."""
        return param_groups({ADAPTER.pattern: tx}, default=None)


def _is_quantized(x: Any) -> bool:
    from qwix._src.providers.ptq import WithAux

    return isinstance(x, WithAux)


def dequantized(tree: PyTree, leaf=None) -> PyTree:
    """`tree` with each quantized weight replaced by `leaf(weight)` (default: its float value)."""
    import qwix

    leaf = leaf or (lambda w: qwix.dequantize(w.array))
    return jax.tree.map(lambda x: leaf(x) if _is_quantized(x) else x, tree, is_leaf=_is_quantized)


def float_abstract(abstract: PyTree) -> PyTree:
    """The abstract tree with each quantized weight as the float array it stands for."""
    return dequantized(abstract, lambda w: jax.ShapeDtypeStruct(w.array.qvalue.shape, w.array.scale.dtype))


def place_quantized(place, abstract, shardings, initial):
    """`place(abstract, shardings, initial)` (a `WeightsLoad.place`) for a QLoRA model: the
    weights read as floats into the quantized weights' shapes and shardings, then quantized as
    the model holds them (qwix's `quantize_params`, each weight's own scheme)."""
    import qwix

    (params, model_state), report = place(
        (float_abstract(abstract[0]), abstract[1]),
        (dequantized(shardings[0], lambda w: w.array.qvalue), shardings[1]),
        lambda: (dequantized(initial()[0]), initial()[1]))
    quantized = qwix.quantize_params(params, abstract[0])
    return (jax.device_put(quantized, shardings[0]), model_state), report


def merged(params: PyTree, spec: LoraSpec) -> PyTree:
    """The parameters with each adapted weight replaced by `W + A @ B * alpha / rank` and the
    adapters left out: the base model the adapters make, for export."""
    params = dequantized(params)  # QLoRA: the export is float
    if isinstance(params, dict):
        out = {}
        for key, value in params.items():
            if isinstance(key, str) and ADAPTER.fullmatch(key):
                continue
            a, b = params.get(f"{key}_lora_a"), params.get(f"{key}_lora_b")
            if a is not None and b is not None:
                delta = (jnp.asarray(a, jnp.float32) @ jnp.asarray(b, jnp.float32)) * spec.scale
                # qwix's A is [contracting, rank], B [rank, remaining]: a Dense kernel's order
                value = (jnp.asarray(value, jnp.float32) + delta.reshape(value.shape)).astype(value.dtype)
            out[key] = merged(value, spec)
        return out
    return params


def saved(variables: tuple[PyTree, PyTree], spec: LoraSpec, lora: str, owner: str) -> tuple[PyTree, PyTree]:
    """`(params, model_state)` as `save_weights(lora=...)` writes them: the adapters merged into
    their weights ("merge"), alone ("adapters") or both as they are ("keep")."""
    params, model_state = variables
    if lora == "merge":
        return merged(params, spec), model_state
    if lora == "adapters":
        flat = flat_arrays((params, {}))
        return {n: a for n, a in flat.items() if n in adapter_names(flat)}, {}
    if lora == "keep":
        return params, model_state
    raise ValueError(f"{owner}.save_weights(lora={lora!r}): pass 'merge' (the adapted weights, "
                     "for export), 'adapters' (the adapters alone) or 'keep' (both as they are).")


def adapter_names(names: Any) -> frozenset[str]:
    return frozenset(n for n in names if ADAPTER.fullmatch(n))

