"""A griffe extension: a property whose setter only raises is read-only on its page.

griffe labels any property with a `@name.setter` "writable". The Trainer's read-only attributes
(`max_epochs`, `global_step`, ...) have a setter that raises an error saying what to do instead
(Python's own, "has no setter", does not), so they would read as writable. This takes the label
off where the setter's body, past its docstring, is a single `raise`. Loaded by mkdocstrings
(`extensions:` in mkdocs.yml).
"""

from __future__ import annotations

import ast

import griffe


def only_raises(node: ast.AST) -> bool:
    """Whether `node`, a function definition, does nothing but raise.

    Example:
        >>> only_raises(ast.parse("def f(self, value):\\n    raise AttributeError('read-only')").body[0])
        True
        >>> only_raises(ast.parse("def f(self, value):\\n    self._f = value").body[0])
        False
    """
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return len(body) == 1 and isinstance(body[0], ast.Raise)


class ReadOnly(griffe.Extension):
    """No "writable" label on a property whose setter only raises."""

    def on_function_instance(self, *, node: ast.AST | griffe.ObjectNode, func: griffe.Function, **kwargs) -> None:
        owner = func.parent
        prop = owner.members.get(func.name) if owner is not None else None
        if isinstance(prop, griffe.Attribute) and prop.setter is func and isinstance(node, ast.AST) \
                and only_raises(node):
            prop.labels.discard("writable")
