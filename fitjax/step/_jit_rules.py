"""JAX's tracer errors from a user's traced method, re-raised with the jit rule broken and the fix;
and where a user's method is, for the errors about what it returned.

The same help for `loss` and `metrics` (traced here, in the step layer) as for Lightning's hooks
(`training_step`, ... in `fitjax.module._lightning`): JAX's own message names the tracer, not the rule.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

import jax

__all__ = ["HOST_WORK", "defined_at", "explain_jit_rules"]

_JIT_RULES = (
    (jax.errors.TracerBoolConversionError,
     "a Python `if`/`while`/`and`/`or`/`assert` on a traced value. The step is compiled once, so a "
     "branch cannot depend on the data; compute both sides and pick with `jnp.where(cond, a, b)`, "
     "use `jax.lax.cond`, or branch on static facts (`self.training`, shapes, hyperparameters)"),
    (jax.errors.TracerArrayConversionError,
     "a traced value converted to a NumPy array (`np.asarray(x)`, `np.mean(x)`, `torch.tensor(x)`). "
     "Inside the step values are abstract tracers, not numbers; use `jax.numpy` (`jnp.mean(x)`)"),
    (jax.errors.TracerIntegerConversionError,
     "`int(x)` or a Python index from a traced value. Index with arrays instead (`x[idx]`, "
     "`jnp.take`, `jax.lax.dynamic_slice`) or keep the integer static"),
    (jax.errors.ConcretizationTypeError,
     "a concrete number asked of a traced value (`.item()`, `float(x)`, `.tolist()`). The step "
     "runs as compiled code with no host round trip; return the array or `self.log(name, x)` it "
     "(fitjax fetches logged values when it logs), and print with `jax.debug.print('{}', x)`"),
)


# Where the traced step's errors send work that needs Python values between steps.
HOST_WORK = ("Work that needs Python values between steps (an environment step, a replay buffer, "
             "a decision on a metric) belongs in the module's host hooks `on_train_batch_start(batch, "
             "batch_idx)` / `on_train_batch_end(outputs, batch, batch_idx)`, called between steps as in "
             "Lightning.")


@contextlib.contextmanager
def explain_jit_rules(owner: str, method: str) -> Iterator[None]:
    """Re-raises JAX's tracer errors from a user method with the jit rule broken and the fix."""
    try:
        yield
    except Exception as err:
        host_metric = _host_only_metric(err)
        if host_metric is not None:
            raise TypeError(
                f"{owner}.{method} calls {host_metric}.from_model_output, which takes Python strings "
                f"(or lists of tokens) and loops over them in Python: it cannot run in the jitted step, "
                f"where the batch and outputs are arrays traced once. Compute it on the host: append the "
                f"step's token ids to a list in `validation_step` (`self.validation_step_outputs`), or "
                f"take `trainer.predict`'s outputs, decode them to strings and call "
                f"`{host_metric}.from_model_output(predictions, references).compute()` there "
                f"(docs/guides/metrics.md). The error it raised follows: {type(err).__name__}."
            ) from err
        what = next((text for kind, text in _JIT_RULES if isinstance(err, kind)), None)
        if what is None:
            raise
        raise TypeError(
            f"{owner}.{method} is traced under jax.jit (once, with abstract values) and does {what}. "
            f"`print(x)` is fine but shows a tracer. {HOST_WORK} JAX's message follows: "
            f"{type(err).__name__}."
        ) from err


def _host_only_metric(err: BaseException) -> str | None:
    """`"metrax.BLEU"` (WER, RougeL, RougeN) when `err` came from that string metric's
    `from_model_output`, which a traced method cannot call; else None."""
    import traceback

    for frame, _ in traceback.walk_tb(err.__traceback__):
        cls = frame.f_locals.get("cls") if frame.f_code.co_name == "from_model_output" else None
        if isinstance(cls, type) and frame.f_globals.get("__name__", "").startswith("metrax.nlp_metrics") \
                and cls.__name__ in _HOST_ONLY_METRICS:
            return f"metrax.{cls.__name__}"
    return None


# metrax's metrics of text: `from_model_output` splits strings and counts n-grams in Python
_HOST_ONLY_METRICS = ("BLEU", "RougeL", "RougeN", "WER")


def defined_at(module: object, method: str) -> str:
    """`" (defined at <file>:<line>)"` for `type(module).<method>`: an error about what the
    method returned points at the user's code, not at the fitjax frame that checked it
    (empty when the source is unknown, e.g. a builtin)."""
    function = inspect.unwrap(getattr(type(module), method, None) or (lambda: None))
    code = getattr(function, "__code__", None)
    return "" if code is None else f" ({type(module).__name__}.{method} is defined at {code.co_filename}:{code.co_firstlineno})"
