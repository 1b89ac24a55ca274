"""Every public name imports, and `__all__` is sorted and complete."""

import importlib

import pytest


PACKAGES = ["fitjax", "fitjax.callbacks", "fitjax.cli", "fitjax.data", "fitjax.loggers", "fitjax.metrics",
            "fitjax.models", "fitjax.nn",
            "fitjax.integrations.ray", "fitjax.plugins", "fitjax.plugins.environments", "fitjax.planner",
            "fitjax.profilers", "fitjax.runs", "fitjax.strategies", "fitjax.tuner"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_importable(name):
    module = importlib.import_module(name)
    assert list(module.__all__) == sorted(module.__all__)
    for public in module.__all__:
        assert getattr(module, public) is not None


def test_docstring_examples_run():
    import doctest

    for name in ["fitjax.module._lit_module", "fitjax.loop.trainer", "fitjax.loop.progress", "fitjax.loop.config",
                 "fitjax.loop.metric_log", "fitjax.metrics", "fitjax.metrics._base", "fitjax.metrics._classification",
                 "fitjax.metrics._ranking", "fitjax.metrics._regression", "fitjax.metrics._collection",
                 "fitjax.strategies.dp",
                 "fitjax.callbacks.ema", "fitjax.callbacks.generation_monitor", "fitjax.tuner._tuner", "fitjax.profilers", "fitjax.profilers._base",
                 "fitjax.profilers._simple", "fitjax.profilers._jax_trace", "fitjax.profilers._compile",
                 "fitjax.plugins.environments._base", "fitjax.plugins.environments.lightning",
                 "fitjax.plugins.environments.slurm", "fitjax.strategies._distributed",
                 "fitjax.integrations.ray", "fitjax.planner._flops", "fitjax.planner._choose", "fitjax.loop.plan",
                 "fitjax.nn._attention", "fitjax.models._config", "fitjax.models._causal_lm",
                 "fitjax.models._pretrained", "fitjax.data._text", "fitjax._generation_options"]:
        failures, _ = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert failures == 0, name


@pytest.mark.parametrize("name, first, after", [
    ("Trainer", "Trains a `LitModule`", "Example:\n    >>> import fitjax as fj"),
    ("Trainer.plan", "Will it fit, and how fast", "Returns:\n    A `fitjax.planner.Plan`"),
    ("Trainer.generate", "Continues each prompt", "Example:\n    >>> # trainer.generate("),
])
def test_help_documents_every_trainer_argument(name, first, after):
    """`help(fj.Trainer)`, `help(trainer.plan)` and `help(trainer.generate)` show each argument's
    reference (the Args section written in the source's docstring, where an IDE reads it too)
    between the summary and the next section."""
    import inspect
    import pydoc
    import re

    import fitjax as fj

    obj = fj.Trainer if name == "Trainer" else getattr(fj.Trainer, name.split(".")[1])
    head, _, rest = inspect.getdoc(obj).partition("\nArgs:\n")
    arguments, _, tail = rest.partition("\n\n")
    assert head.startswith(first) and tail.startswith(after)
    names = set(inspect.signature(obj).parameters) - {"self"}
    assert set(re.findall(r"^    (\w+): ", arguments, re.M)) == names
    described = re.search(r"^    (\w+): (.+)$", arguments, re.M).group(2)  # the first argument's description
    assert described in pydoc.render_doc(obj, renderer=pydoc.plaintext)
