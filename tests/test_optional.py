"""`pip install 'fitjax[lm]'` brings what the language-model path imports, and a missing package
is named, with that command, where the feature is set up (issue 61: five bare
`ModuleNotFoundError`s one at a time, the last after 150 trained steps)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from fitjax._optional import EXTRAS, require

ROOT = Path(__file__).resolve().parents[1]


def _distribution(requirement: str) -> str:
    for stop in "<>=![; ":
        requirement = requirement.split(stop)[0]
    return requirement.lower()


def test_the_lm_extra_lists_the_packages_fitjax_checks_and_dev_includes_it():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(map(_distribution, extras["lm"])) == sorted(EXTRAS["lm"].values())
    assert "fitjax[lm]" in extras["dev"]


def test_require_names_the_missing_package_and_the_extra():
    require("json", feature="x")
    with pytest.raises(ImportError, match=r"`f\(\)` needs not_a_package_61, not installed in this environment "
                                          r"\(.*\)\. Install them with: pip install 'fitjax\[lm\]'"):
        require("json", "not_a_package_61", feature="`f()`")


# Each case runs where its package cannot be found (a finder first on `sys.meta_path` refuses
# it, as an environment without it would), in one fresh process: nothing is imported before.
_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path

    BLOCKED = set()

    class Uninstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Uninstalled())
    import fitjax as fj
    from fitjax import models

    folder = Path(tempfile.mkdtemp())
    (folder / "a.jsonl").write_text(json.dumps({"text": "a b"}) + "\\n")

    def case(blocked, make):
        BLOCKED.clear()
        BLOCKED.add(blocked)
        try:
            make()
        except ImportError as err:
            print(blocked, "->", err)
        else:
            print(blocked, "-> nothing raised")

    def tokenizer():
        from tokenizers import Tokenizer, models as tm
        return Tokenizer(tm.WordLevel({"<pad>": 0, "a": 1, "b": 2}, unk_token="<pad>"))

    case("grain", lambda: fj.data.TextLoader(folder / "a.jsonl", tokenizer=tokenizer(), seq_len=4, batch_size=1))
    case("transformers", lambda: fj.data.TextLoader(folder / "a.jsonl", tokenizer=folder, seq_len=4, batch_size=1))
    case("qwix", lambda: models.CausalLMModule({"model_type": "llama", "vocab_size": 8, "hidden_size": 8,
                                                "intermediate_size": 8, "num_hidden_layers": 1,
                                                "num_attention_heads": 2}).apply_lora(rank=2))

    def chat():
        from transformers import PreTrainedTokenizerFast
        made = PreTrainedTokenizerFast(tokenizer_object=tokenizer(), pad_token="<pad>")
        made.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        BLOCKED.add("jinja2")
        for name in [n for n in sys.modules if n.partition(".")[0] == "jinja2"]:  # transformers imported it
            del sys.modules[name]
        fj.data.TextLoader(folder / "a.jsonl", tokenizer=made, seq_len=4, batch_size=1)

    case("nothing", chat)
""")


def test_each_feature_names_its_missing_package_when_it_is_set_up():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" -> ", 1) for line in done.stdout.splitlines() if " -> " in line)
    install = "Install them with: pip install 'fitjax[lm]'"
    assert lines["grain"].startswith("`fj.data.TextLoader(...)` needs grain, not installed") and install in lines["grain"]
    assert lines["transformers"].startswith("`tokenizer=") and "needs transformers" in lines["transformers"]
    assert lines["qwix"].startswith("`CausalLMModule.apply_lora(...)` (adapters made by Google's qwix) needs qwix")
    assert lines["nothing"].startswith("the tokenizer's chat template needs jinja2") and install in lines["nothing"]
