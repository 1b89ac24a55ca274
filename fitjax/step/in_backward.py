"""The optimizer update applied layer by layer inside the backward pass
(`Trainer(update_in_backward=True)`, torchtune's `optimizer_in_bwd`): no whole-model gradient is
ever held, only one layer's.

For a model whose layers are one scan over stacked parameters (`CausalLMModule(scan_layers=True)`,
which offers its stack through `fitjax.step.layer_stack.run_layers`), one optimizer step is:

    x0, pullback_in = vjp(everything before the layers, rest)   # the embedding (the stack captured)
    y, inputs = scan(layer, x0, layers)                          # each layer's input kept
    loss, pullback_out = vjp(everything after the layers, rest, y)   # norm, head, loss
    grad_rest, dy = pullback_out(1)
    for i = L-1 .. 0 (a reverse `lax.scan` carrying dy, the stacked params and optimizer state):
        g_i, dy = vjp(layer, layers[i], inputs[i])(dy)           # the layer recomputed
        layers[i], state[i] = optimizer update of g_i alone      # then g_i is dropped
    rest, state_rest = optimizer update of grad_rest + pullback_in(dy)

The state keeps its usual layout (the optimizer is initialised on the whole model; a checkpoint
moves between runs with and without the option): each layer's step reads and writes its slice of
every stacked optimizer leaf, and the leaves that are not per parameter (the step count, an
injected learning rate) are read as they are and written once, by the rest's update.

Equal to the usual step when the optimizer treats each parameter leaf alone and each layer's
slice of a stacked leaf alone (Adam, AdamW, SGD, Lion, `fj.optim.adamw(moments=...)`): checked for
the first (`check_per_leaf`), documented for the second (a per-leaf norm such as LAMB's trust
ratio would see one layer instead of the stack). Each layer's forward pass runs twice, as with
`remat="full"`. The optimizer is told which slice it updates (`stack_slice=fj.optim.StackSlice`,
an extra argument): `fj.optim`'s 8-bit moments then round stochastically with the very bits of
the usual step, its bfloat16 ones with bits of the layer's own (the usual step's draw for the
whole stacked leaf at once); either way no two layers draw the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.extend.core import Literal

from fitjax.optim import StackSlice
from fitjax.step import layer_stack

__all__ = ["StateLayout", "check_per_leaf", "find_stack", "fused_update"]


def find_stack(loss_of: Callable, params: Any, model_state: Any, rng: jax.Array, batch: Any,
               owner: str) -> layer_stack.Captured:
    """The model's layer stack, found by tracing its loss once abstractly; raises when it has none."""
    found: list[layer_stack.Captured] = []

    def probe(params):
        with layer_stack.capturing() as captured:
            loss_of(params, model_state, rng, batch)
        found.extend(dataclasses.replace(c, x=None, context=None) for c in captured)  # no tracer leaves

    jax.eval_shape(probe, params)
    if len(found) != 1:
        raise ValueError(
            f"Trainer(update_in_backward=True) updates a model's layers one at a time inside the "
            f"backward pass; {owner}'s loss called {len(found)} scanned layer stacks (it needs exactly one). "
            "Use a `fitjax.models.CausalLMModule(..., scan_layers=True)` (layers stacked under one "
            "`nn.scan`), or leave update_in_backward=False.")
    stack = found[0]
    if not isinstance(params, dict) or stack.key not in params:
        raise ValueError(f"Trainer(update_in_backward=True): {owner}'s layer stack {stack.key!r} is not a "
                         f"top-level key of its parameters ({sorted(params) if isinstance(params, dict) else params!r}).")
    return stack


def _dependencies(jaxpr, inputs: list[frozenset]) -> list[frozenset]:
    """For each output of `jaxpr`, the input numbers it depends on (calls followed, loops and
    conditionals taken whole: an equation's outputs depend on all its inputs)."""
    deps: dict[Any, frozenset] = dict(zip(jaxpr.invars, inputs))

    def of(v):
        return frozenset() if isinstance(v, Literal) else deps.get(v, frozenset())

    for eqn in jaxpr.eqns:
        sub = eqn.params.get("jaxpr") if eqn.primitive.name in ("pjit", "jit", "closed_call", "core_call") else None
        ins = [of(v) for v in eqn.invars]
        if sub is not None:
            outs = _dependencies(getattr(sub, "jaxpr", sub), ins)
        else:
            union = frozenset().union(*ins)
            outs = [union] * len(eqn.outvars)
        deps.update(zip(eqn.outvars, outs))
    return [of(v) for v in jaxpr.outvars]


def check_per_leaf(update_fn: Callable, grads: Any, opt_state: Any, params: Any, owner: str) -> None:
    """Raises unless the optimizer's update of each parameter leaf reads that leaf's gradient
    alone, and each leaf of its new state at most one leaf's (traced abstractly: a global-norm
    clip, `optax.apply_if_finite`, anything reading the whole gradient is refused)."""
    abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    grads, opt_state, params = abstract(grads), abstract(opt_state), abstract(params)
    n = len(jax.tree.leaves(grads))

    def update(grads, opt_state, params):
        return update_fn(grads, opt_state, params, value=jnp.zeros((), jnp.float32))

    closed = jax.make_jaxpr(update)(grads, opt_state, params)
    count = len(closed.jaxpr.invars)
    outs = _dependencies(closed.jaxpr, [frozenset([i]) if i < n else frozenset() for i in range(count)])
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(grads)[0]]
    for j, d in enumerate(outs[:n]):
        if not d <= {j}:
            raise ValueError(
                f"Trainer(update_in_backward=True) updates each layer as its gradient appears, but "
                f"{owner}'s optimizer computes the update of {paths[j]} from the gradients of "
                f"{[paths[i] for i in sorted(d - {j})][:3]}...: it reads more than one parameter's gradient "
                "(a global-norm clip, `optax.apply_if_finite`, ...). Use an optimizer that updates each "
                "parameter alone (`fj.optim.adamw`, `optax.adamw`), or leave update_in_backward=False.")
    for j, d in enumerate(outs[n:]):
        if len(d) > 1:
            raise ValueError(
                f"Trainer(update_in_backward=True): {owner}'s optimizer keeps state computed from the "
                f"gradients of several parameters ({[paths[i] for i in sorted(d)][:3]}...), which the "
                "layer-by-layer update never holds together. Use an optimizer that updates each parameter "
                "alone (`fj.optim.adamw`, `optax.adamw`), or leave update_in_backward=False.")


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """Where each leaf of the optimizer state (initialised on the whole model) goes: the leaves of
    one layer's state (`layer_tree`, the optimizer's state of `{key: one layer}`) are slices of
    `stacked` leaves or `shared` ones as they are; the rest's state (`rest_tree`) is leaves of the
    whole state; the whole state's leaves are each one of those."""

    full_tree: Any
    layer_tree: Any
    # per leaf of one layer's state: ("stacked" | "shared" | "layer-only", the whole state's leaf)
    layer_from: tuple[tuple[str, int], ...]
    rest_tree: Any
    rest_from: tuple[int, ...]

    @classmethod
    def of(cls, tx: optax.GradientTransformation, opt_state: Any, key: str, stacked: Any, rest: Any,
           owner: str) -> "StateLayout":
        flat, full_tree = jax.tree_util.tree_flatten_with_path(opt_state)
        where = {path: i for i, (path, _) in enumerate(flat)}
        layers = jax.tree.leaves(stacked)[0].shape[0]
        # the optimizer's state of the layers alone, and of a stack one layer deeper: a leaf that
        # deepens with it is per layer, one that does not is shared (the step count)
        deeper = jax.tree.map(lambda a: jax.ShapeDtypeStruct((layers + 1, *a.shape[1:]), a.dtype), stacked)
        layer_flat, layer_tree = jax.tree_util.tree_flatten_with_path(jax.eval_shape(tx.init, {key: stacked}))
        deeper_flat, deeper_tree = jax.tree_util.tree_flatten_with_path(jax.eval_shape(tx.init, {key: deeper}))
        rest_flat, rest_tree = jax.tree_util.tree_flatten_with_path(jax.eval_shape(tx.init, rest))

        def refuse(path, why):
            return ValueError(
                f"Trainer(update_in_backward=True): {owner}'s optimizer state at {jax.tree_util.keystr(path)} "
                f"{why}, so one layer's state is not a slice of the whole model's. Use an optimizer whose state "
                "is per parameter (`fj.optim.adamw`, `optax.adamw`), or leave update_in_backward=False.")

        if deeper_tree != layer_tree:
            raise refuse((), "changes its structure with the number of layers")
        layer_from = []
        for (path, leaf), (_, deep) in zip(layer_flat, deeper_flat):
            whole = flat[where[path]][1] if path in where else None
            if whole is None or (whole.shape, whole.dtype) != (leaf.shape, leaf.dtype):
                raise refuse(path, "differs between the layers alone and the whole model")
            if deep.shape == leaf.shape:
                layer_from.append(("shared", where[path]))
            elif leaf.shape and deep.shape == (layers + 1, *leaf.shape[1:]) and leaf.shape[0] == layers:
                layer_from.append(("stacked", where[path]))
            else:
                raise refuse(path, f"has shape {leaf.shape} for {layers} layers and {deep.shape} for {layers + 1}")
        layer_tree = jax.tree.structure(jax.eval_shape(
            tx.init, {key: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), stacked)}))
        if layer_tree.num_leaves != len(layer_from):
            raise refuse((), "has another structure for one layer than for the stack")
        rest_from = []
        for path, leaf in rest_flat:
            if path not in where or flat[where[path]][1].shape != leaf.shape:
                raise refuse(path, "is not the same for the rest of the model alone")
            rest_from.append(where[path])
        covered = {i for _, i in layer_from} | set(rest_from)
        missing = [flat[i][0] for i in range(len(flat)) if i not in covered]
        if missing:
            raise refuse(missing[0], "belongs neither to the layers nor to the rest of the model")
        # a shared leaf of the layers' state alone (8-bit Adam's placeholder scale of a float32 leaf)
        # is written by the layers' updates, each computing it from the value the step started with
        layer_from = [("layer-only" if kind == "shared" and i not in rest_from else kind, i) for kind, i in layer_from]
        return cls(full_tree, layer_tree, tuple(layer_from), rest_tree, tuple(rest_from))

    def layer_state(self, opt_state: Any, start: Any, index: jax.Array) -> Any:
        """Layer `index`'s optimizer state (traced index): its slice of each stacked leaf of
        `opt_state`, the shared leaves as the step found them (`start`)."""
        leaves, first = jax.tree.leaves(opt_state), jax.tree.leaves(start)
        return self.layer_tree.unflatten([
            jax.lax.dynamic_index_in_dim(leaves[i], index, keepdims=False) if kind == "stacked" else first[i]
            for kind, i in self.layer_from])

    def put_layer(self, opt_state: Any, index: jax.Array, new: Any) -> Any:
        """`opt_state` with layer `index`'s slices of the stacked leaves from `new` (the shared
        leaves the rest's state also holds are written by `put_rest`)."""
        leaves = list(jax.tree.leaves(opt_state))
        for (kind, i), leaf in zip(self.layer_from, self.layer_tree.flatten_up_to(new)):
            if kind == "stacked":
                leaves[i] = jax.lax.dynamic_update_index_in_dim(leaves[i], leaf.astype(leaves[i].dtype), index, 0)
            elif kind == "layer-only":
                leaves[i] = leaf.astype(leaves[i].dtype)
        return self.full_tree.unflatten(leaves)

    def rest_state(self, opt_state: Any) -> Any:
        leaves = jax.tree.leaves(opt_state)
        return self.rest_tree.unflatten([leaves[i] for i in self.rest_from])

    def put_rest(self, opt_state: Any, new: Any) -> Any:
        leaves = list(jax.tree.leaves(opt_state))
        for i, leaf in zip(self.rest_from, self.rest_tree.flatten_up_to(new)):
            leaves[i] = leaf
        return self.full_tree.unflatten(leaves)


def _squares(tree: Any) -> jax.Array:
    leaves = [x.ravel().astype(jnp.float32) for x in jax.tree.leaves(tree)]
    return sum((jnp.vdot(x, x) for x in leaves), jnp.zeros((), jnp.float32))


def fused_update(loss_of: Callable, tx: optax.GradientTransformation, update_fn: Callable,
                 cast: Callable, owner: str) -> Callable:
    """`step(params, model_state, rng, batch, opt_state) -> (params, opt_state, loss, count,
    outputs, new_model_state, logged, grad_norm)`: one optimizer step with each layer updated
    inside the backward pass (see the module doc).

    `loss_of(params, model_state, rng, batch) -> (loss, count, outputs, new_state, logged)` is the
    step's loss (`fitjax.step.train.gradients`'s); `update_fn(grads, state, params, value=loss)`
    the optimizer's update; `cast` the precision policy's cast of parameters to the compute dtype.
    A `TokenLoss`'s gradient is its sum's divided by its count, as in the usual step.
    """

    def step(params, model_state, rng, batch, opt_state):
        stack = find_stack(loss_of, params, model_state, rng, batch, owner)
        key, layer, num_layers = stack.key, stack.layer, stack.num_layers
        stacked = params[key]
        rest = {k: v for k, v in params.items() if k != key}
        check_per_leaf(update_fn, params, opt_state, params, owner)
        layout = StateLayout.of(tx, opt_state, key, stacked, rest, owner)
        # each leaf's number in the whole tree: an optimizer that rounds stochastically draws by it
        # (`fj.optim.StackSlice`), so the layers do not all draw the same bits
        number = {path: i for i, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(params)[0])}
        ids = lambda tree: tuple(number[path] for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0])  # noqa: E731
        layer_ids, rest_ids = ids({key: stacked}), ids(rest)

        def before(rest):
            with layer_stack.capturing() as captured:
                loss_of({**rest, key: stacked}, model_state, rng, batch)
            return captured[0].x, captured[0].context

        x0, pull_in, context = jax.vjp(before, rest, has_aux=True)

        def forward_layer(x, xs):
            layer_params, i = xs
            return layer(cast(layer_params), x, context, i), x

        indices = jnp.arange(num_layers, dtype=jnp.int32)
        y, inputs = jax.lax.scan(forward_layer, x0, (stacked, indices))

        def after(rest, y):
            with layer_stack.replaced(y):
                loss, count, outputs, new_state, logged = loss_of({**rest, key: stacked}, model_state, rng, batch)
            return loss, (loss, count, outputs, new_state, logged)

        loss, pull_out, aux = jax.vjp(after, rest, y, has_aux=True)
        _, count, outputs, new_state, logged = aux
        grad_rest, dy = pull_out(jnp.ones_like(loss))

        def per_count(grads, like):  # a TokenLoss: the sum's gradient over the tokens, as the usual step
            if count is None:
                return grads
            divisor = jnp.maximum(count, 1.0)
            return jax.tree.map(lambda g, p: (g / divisor).astype(p.dtype), grads, like)

        def backward_layer(carry, i):
            dy, stacked, opt_state, squares = carry
            layer_params = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), stacked)
            x = jax.lax.dynamic_index_in_dim(inputs, i, keepdims=False)
            _, pull = jax.vjp(lambda p, x: layer(cast(p), x, context, i), layer_params, x)
            grads, dx = pull(dy)
            grads = per_count(grads, layer_params)
            updates, new = update_fn({key: grads}, layout.layer_state(opt_state, start, i), {key: layer_params},
                                     value=loss, stack_slice=StackSlice(layer_ids, i))
            new_params = optax.apply_updates(layer_params, updates[key])
            stacked = jax.tree.map(lambda a, p: jax.lax.dynamic_update_index_in_dim(a, p.astype(a.dtype), i, 0),
                                   stacked, new_params)
            return (dx, stacked, layout.put_layer(opt_state, i, new), squares + _squares(grads)), None

        start = opt_state
        carry = (dy, stacked, opt_state, jnp.zeros((), jnp.float32))
        (dx0, stacked, opt_state, squares), _ = jax.lax.scan(backward_layer, carry, indices[::-1])
        (grad_in,) = pull_in(dx0)
        grad_rest = per_count(jax.tree.map(jnp.add, grad_rest, grad_in), rest)
        updates, new_rest_state = update_fn(grad_rest, layout.rest_state(opt_state), rest, value=loss,
                                            stack_slice=StackSlice(rest_ids))
        opt_state = layout.put_rest(opt_state, new_rest_state)
        new_params = {**optax.apply_updates(rest, updates), key: stacked}
        grad_norm = jnp.sqrt(squares + _squares(grad_rest))
        return new_params, opt_state, loss, count, outputs, new_state, logged, grad_norm

    return step
