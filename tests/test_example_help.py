"""`python examples/X.py --help` prints the module docstring as written (argparse's
RawDescriptionHelpFormatter), so each docstring line must fit an 80-column terminal."""

from __future__ import annotations

import ast
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WIDTH = 80


def test_every_example_docstring_fits_80_columns():
    # Parsing with ast, not importing: no JAX, no subprocess per example (the suite's 2-core budget).
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert scripts, f"no examples found under {EXAMPLES}"
    too_wide = []
    for script in scripts:
        module = ast.parse(script.read_text(), filename=str(script))
        doc = ast.get_docstring(module, clean=False)
        assert doc, f"{script.name} has no module docstring: --help would describe nothing"
        start = module.body[0].lineno  # the docstring's first source line
        too_wide += [f"{script.name}:{start + i}: {len(line)} columns: {line!r}"
                     for i, line in enumerate(doc.splitlines()) if len(line) > WIDTH]
    assert not too_wide, (f"example docstrings are --help's description and must fit {WIDTH} columns; "
                          "reflow these lines (a long command may continue with a trailing backslash "
                          "in an r-string docstring):\n" + "\n".join(too_wide))
