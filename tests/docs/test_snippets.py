"""Every Python snippet in README and the site's pages runs as written, or says on the page why not.

The runnable blocks of a page run in order in one namespace (a later block uses what an earlier
one defined), in a fresh working directory, so what they write (`runs/`) lands there.
"""

from __future__ import annotations

import os
import re

import pytest
from docs_pages import ROOT, pages, python_snippets

PAGES = [p for p in pages() if python_snippets(p.read_text())]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_python_snippets_of_a_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environ = dict(os.environ)  # a snippet may set XLA_FLAGS for its reader's fresh process
    scope = {"__name__": "__docs__"}
    try:
        for snippet in python_snippets(page.read_text()):
            if snippet.not_run is not None:
                continue
            exec(compile(snippet.code, f"{page}:{snippet.line}", "exec"), scope)
    finally:
        os.environ.clear()
        os.environ.update(environ)


def test_every_snippet_not_run_says_why_and_excerpts_are_verbatim():
    marked = 0
    for page in pages():
        for snippet in python_snippets(page.read_text()):
            if snippet.not_run is None:
                continue
            marked += 1
            assert len(snippet.not_run.split()) >= 4, f"{page}:{snippet.line}: give a reason, got {snippet.not_run!r}"
            source = re.search(r"excerpt of `(examples/[\w/]+\.py)`", snippet.not_run)
            if source:
                assert "verbatim" in snippet.not_run
                assert snippet.code.rstrip("\n") in (ROOT / source.group(1)).read_text(), (
                    f"{page}:{snippet.line}: this excerpt is no longer in {source.group(1)} as written")
    assert marked >= 5  # getting-started's excerpts of digits.py at least


def test_readme_starts_with_the_example_and_the_test_command_ci_runs():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).splitlines()
    assert readme.index("```bash") < readme.index("##"), "the two commands come before any section"
    assert "python examples/digits.py" in first[0]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    ci_test_command = next(line for line in ci if line.startswith("python -m pytest"))
    assert ci_test_command in first[1], (first[1], ci_test_command)
    # then the language-model example, at its smallest settings, in the venv `[dev]` made (with `[lm]`)
    assert ci[-1].startswith("python examples/sft.py "), ci[-1]
    assert any('pip install -e ".[lm]"' in line and "python examples/sft.py" in line for line in first[2:]), first
    assert len(readme.splitlines()) <= 200
