"""The site builds with warnings as errors, and a broken reference or a missing API entry fails it."""

from __future__ import annotations

import inspect
import re
import sys

import pytest
import yaml
from conftest import ROOT, build_site

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import reference  # noqa: E402  (docs/hooks/reference.py: the hook that writes the API pages)


def test_every_page_of_the_nav_is_built(site):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from pages(value) if isinstance(value, list) else [value]

    for page in pages(config["nav"]):
        assert (site / page.replace(".md", ".html")).is_file(), page
    assert (site / "search" / "search_index.json").is_file()


@pytest.mark.parametrize("text, named", [
    ("See [the trainer][fitjax.NoSuchTrainer].", "fitjax.NoSuchTrainer"),
    ("::: fitjax.NoSuchName", "fitjax.NoSuchName"),
], ids=["broken cross-reference", "missing API entry"])
def test_a_broken_reference_fails_the_build(tmp_path, text, named):
    # the project's own configuration and plugins, on one page holding the mistake
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config.pop("hooks")
    python = config["plugins"][2]["mkdocstrings"]["handlers"]["python"]
    python["options"]["extensions"] = [str(ROOT / e) for e in python["options"]["extensions"]]
    config["docs_dir"] = str(tmp_path / "docs")
    config["nav"] = ["index.md"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# A page\n\n{text}\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert named in output and "Traceback" not in output, output


def test_every_public_name_has_a_reference_page_with_its_docstring(site):
    entries = reference.public_entries()
    names = {name for entry in entries for name in entry.names}
    assert {"fitjax.Trainer", "fitjax.ModelCheckpoint", "fitjax.strategies.FSDP", "fitjax.cli.LightningCLI"} <= names
    for module_name in reference.public_modules():
        module = sys.modules[module_name]
        for name in module.__all__:
            assert f"{module_name}.{name}" in names | set(reference.public_modules()), f"{module_name}.{name}"
    for entry in entries:
        html = (site / entry.page.replace(".md", ".html")).read_text()
        assert f'id="{entry.target}"' in html, f"{entry.name}: no rendered entry for {entry.target}"
        first = reference.first_sentence(entry)
        assert len(first.split()) >= 3 and first.endswith("."), (
            f"{entry.name} needs a docstring that starts with a sentence; it starts {first!r}")
        if _has_written_signature(reference.obj_of(entry)):
            assert "doc-signature" in html, f"{entry.name}: no signature on its page"


def _has_written_signature(obj) -> bool:
    """A function, or a class whose own source defines `__init__` (a generated dataclass
    `__init__` or an inherited one has no source that griffe could read: its fields are listed)."""
    if inspect.isfunction(obj):
        return True
    init = obj.__dict__.get("__init__") if inspect.isclass(obj) else None
    try:
        return init is not None and bool(inspect.getsource(init))
    except (OSError, TypeError):
        return False


def test_guides_link_the_public_names_they_mention_to_their_entries(site):
    import doctest

    assert doctest.testmod(reference).failed == 0  # link_public_names' own example
    ema = next(e for e in reference.public_entries() if e.name == "fitjax.EMA")
    tuning = (site / "guides" / "tuning.html").read_text()
    assert f'href="../reference/fitjax.EMA.html#{ema.target}"' in tuning  # from `fj.EMA(decay=...)`
    trainer = (site / "guides" / "trainer.html").read_text()
    assert 'href="../reference/fitjax.Trainer.html#fitjax.loop.trainer.Trainer"' in trainer  # a written [..][..]


def test_the_beginner_page_shows_no_test_notes_and_porting_words_are_searchable(site):
    import json
    import re

    page = (site / "getting-started.html").read_text()
    assert "Not run" not in re.sub(r"<!--.*?-->", "", page, flags=re.S)  # the notes are hidden comments
    config = json.loads((site / "search" / "search_index.json").read_text())["config"]
    separator = re.compile(config["separator"])
    words = {word.lower() for doc in json.loads((site / "search" / "search_index.json").read_text())["docs"]
             if doc["location"].startswith("porting") for word in separator.split(doc["text"])}
    assert {"ddp", "gpus", "accelerator", "precision", "16"} <= words  # Lightning's words find the page


def test_a_long_signature_is_shown_one_parameter_a_line(site):
    # docs/hooks/signatures.py: formatted without Black or Ruff installed
    html = (site / "reference" / "fitjax.Trainer.html").read_text()
    signature = html[html.index("doc-signature"):]
    code = re.sub(r"<[^>]+>", "", signature[signature.index("<code>"):signature.index("</code>")])
    assert code.startswith("Trainer(\n    *,\n    max_epochs: int | None = None,\n    max_steps:"), code[:300]


def test_the_trainer_page_shows_the_arguments_reference(site):
    # the Args sections written in trainer.py's docstrings, as griffe reads the source
    text = re.sub(r"<[^>]+>", "", (site / "reference" / "fitjax.Trainer.html").read_text())
    assert "stop after this many epochs" in text and "train several runs side by side" in text
    assert "the fraction of the memory kept free" in text  # plan's
    assert "the id (or ids) a row stops at" in text  # generate's
    assert text.index("stop after this many epochs") < text.index("trainer = fj.Trainer(max_epochs=3")


def test_a_read_only_property_is_not_labelled_writable(site):
    # docs/hooks/read_only.py: the Trainer's read-only attributes have a setter that only raises
    html = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (site / "reference" / "fitjax.Trainer.html").read_text()))
    for name in ("max_epochs", "global_step", "callback_metrics"):
        assert f" {name} property &para;" in html, name
    assert " should_stop property writable &para;" in html  # a real setter keeps its label


def test_only_raises_tells_a_refusing_setter_from_a_setting_one():
    import ast

    import read_only  # docs/hooks/read_only.py

    refusing = ast.parse('def f(self, value):\n    """Doc."""\n    raise AttributeError("read-only")\n').body[0]
    setting = ast.parse("def f(self, value):\n    self._f = value\n").body[0]
    assert read_only.only_raises(refusing) and not read_only.only_raises(setting)


def test_the_litmodule_page_lists_the_methods_it_takes_from_its_mixins(site):
    # docs/hooks/reference.py: `load_weights` & co. live on `WeightsMixin`; mkdocstrings shows no
    # inherited member unless told, and LitModule's page is where a user looks for them
    entry = next(e for e in reference.public_entries() if e.name == "fitjax.LitModule")
    assert {"load_weights", "save_weights", "apply_lora", "load_from_checkpoint"} <= set(reference.mixed_in(entry))
    html = (site / "reference" / "fitjax.LitModule.html").read_text()
    for name in ("load_weights", "save_weights", "apply_lora", "load_from_checkpoint", "loss"):
        assert f'id="{entry.target}.{name}"' in html, name
    assert "Starts the next fit (or validate, test, predict) from weights saved elsewhere." in html
