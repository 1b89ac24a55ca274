"""The packages of an extra, checked where a feature needing them is set up: a missing one is an
`ImportError` naming it and the extra that brings it (`pip install 'fitjax[lm]'`), raised when
the user builds the object (a `TextLoader`, LoRA adapters, a pretrained model, a chat template),
before anything trains, instead of a bare `ModuleNotFoundError` one package at a time, some of
them after hundreds of steps.

The check finds the packages (`importlib.util.find_spec`, no import: ~0.1 ms each); the feature
imports them where it uses them, as before.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["EXTRAS", "require"]

#: extra -> {module imported: distribution pip installs}; pyproject.toml's
#: `[project.optional-dependencies]` lists the same (tests/test_optional.py holds them together)
EXTRAS: dict[str, dict[str, str]] = {
    # language models: TextLoader (grain, a Hugging Face tokenizer, pyarrow for Parquet), chat
    # templates (jinja2), LoRA/QLoRA (qwix), Hugging Face folders (safetensors, transformers to
    # load them back)
    "lm": {"grain": "grain", "tokenizers": "tokenizers", "transformers": "transformers", "jinja2": "jinja2",
           "qwix": "qwix", "safetensors": "safetensors", "pyarrow": "pyarrow"},
}


def require(*modules: str, feature: str, extra: str = "lm") -> None:
    """Raises `ImportError` when any of `modules` is not installed, naming them, `feature` (what
    needs them, as the user wrote it) and the extra that brings them.

    Example:
        >>> require("json", feature="`TextLoader(...)`")  # installed: nothing happens
    """
    missing = [name for name in modules if _missing(name)]
    if missing:
        packages = ", ".join(EXTRAS.get(extra, {}).get(name, name) for name in missing)
        raise ImportError(f"{feature} needs {packages}, not installed in this environment ({_where()}). "
                          f"Install them with: pip install 'fitjax[{extra}]'")


def _where() -> str:
    return sys.executable


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a parent package that fails to import, or a broken spec
        return True

