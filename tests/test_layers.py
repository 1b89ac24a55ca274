"""Every fitjax module imports only from its own layer or below (DESIGN.md's layers), no chain of
imports leads back to where it started, and no package imports another package's private module.

The imports are read from the source (every `import`, also those inside functions, and a module
named in a string for `importlib`), so the test needs no import side effects and catches a lazy
import as well as a top-level one. The checks' self-tests feed them real source files with a real
violation.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fitjax"

# Lowest first. A module is placed by its longest matching prefix; modules matching none are
# placed on top (they may import anything, and nothing placed below may import them). The private
# modules left at the top level are the utilities several packages share: `_typing` (every layer),
# `_storage` (checkpoint, callbacks, loggers, profilers, cli), `_safe_names` (names read from a
# checkpoint that become paths: `_storage`, checkpoint, callbacks), `_stack` (warnings pointing at the
# user's line), `_lazy` (checkpoint, loggers),
# `_logged` (`self.log`'s collection: step, module, loop, callbacks, profilers), `_seed` (loop,
# cli, `fj.seed_everything`), `_status` (the set-up's status lines: loop, profilers, callbacks),
# `_ctrl_c` (Ctrl-C from `import fitjax` on: the package, the loop), `_platform` (the platform a
# program is traced for: strategies set it, `fitjax.nn` reads it), and `_optional` (an extra's
# packages checked where a feature is set up: data, module, models), and `_jax_compat` (every reach into
# JAX's privates: strategies, step, data, callbacks, `_ctrl_c`). `_bootstrap` (what `import fitjax`
# does to the process) is on top: only the package imports it.
LAYERS = [
    ("values", ["fitjax._typing", "fitjax.state", "fitjax.metrics", "fitjax.precision", "fitjax.strategies",
                "fitjax._logged", "fitjax._lazy", "fitjax.plugins", "fitjax._storage", "fitjax._safe_names",
                "fitjax._stack", "fitjax._seed", "fitjax._status", "fitjax._ctrl_c", "fitjax._platform",
                "fitjax._optional", "fitjax._jax_compat", "fitjax.optim", "fitjax._generation_options"]),
    ("step", ["fitjax.step", "fitjax.nn"]),
    ("data", ["fitjax.data"]),
    ("checkpoint", ["fitjax.checkpoint"]),
    # what the user writes a module against: `LitModule`, the Lightning-style adapter, hparams and
    # what `configure_optimizers` may return (imported by the loop, so below it)
    ("module", ["fitjax.module"]),
    # the models users import from Hugging Face folders: built on `fitjax.nn`, trained as a
    # `LitModule` (so above "module"); the planner and the loop may use them
    ("models", ["fitjax.models"]),
    # will it fit, and how fast: the train step compiled for a target (`Trainer.plan`, and
    # `strategy="plan"` in the loop, so below it)
    ("plan", ["fitjax.planner"]),
    # several runs of one fit as one program: wraps the step's build, used by the loop
    ("runs", ["fitjax.runs"]),
    ("loop", ["fitjax.loop", "fitjax.profilers"]),
    ("top", ["fitjax.callbacks", "fitjax.loggers", "fitjax.tuner", "fitjax.cli", "fitjax.integrations", "fitjax"]),
]

# The three upward imports there are: the loop makes its default callbacks (progress bar, model
# summary, checkpoint, timer) and loggers from what a user passes to `Trainer(...)`, Lightning's
# flags. Nothing else may join this list.
KNOWN = {
    ("fitjax.loop.trainer", "fitjax.callbacks"),
    ("fitjax.loop.trainer", "fitjax.loggers"),
    ("fitjax.loop._checks", "fitjax.callbacks"),
}


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int:
    best, best_len = len(LAYERS) - 1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > best_len and prefix != "fitjax":
                best, best_len = index, len(prefix)
    return best


def _imports(name: str, path: Path, modules: dict[str, Path] = MODULES) -> set[str]:
    """The fitjax modules `name` imports (a name imported from a package counts as the package
    unless it is a module of its own), and those it names in a string ("fitjax.cli._cli"): a
    module imported by name when first used (`importlib.import_module`, `LazyModule`) is an
    import all the same."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "fitjax")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] != "fitjax":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value \
                and node.value in modules:  # imported by name: `importlib.import_module`, a lazy table
            found.add(node.value)
    return found


def _upward_imports(modules: dict[str, Path] = MODULES) -> list[str]:
    problems = []
    for name, path in sorted(modules.items()):
        here = _layer(name)
        for target in sorted(_imports(name, path, modules)):
            there = _layer(target)
            known = any(name == a and (target == b or target.startswith(b + ".")) for a, b in KNOWN)
            if there > here and not known:
                problems.append(f"{name} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]})")
    return problems


def test_no_module_imports_from_a_layer_above_its_own():
    problems = _upward_imports()
    assert not problems, "upward imports (see DESIGN.md's layers):\n" + "\n".join(problems)


def test_the_step_layer_imports_nothing_from_data_checkpoint_loop_or_callbacks():
    step = [name for name in MODULES if name == "fitjax.step" or name.startswith("fitjax.step.")]
    assert len(step) >= 5
    for name in step:
        for target in _imports(name, MODULES[name]):
            assert _layer(target) <= _layer("fitjax.step"), f"{name} imports {target}"


def _cycles(modules: dict[str, Path] = MODULES) -> list[list[str]]:
    """The import cycles among `modules`: each set of modules that import each other, directly
    or through others (the strongly connected components of the import graph, Tarjan's walk)."""
    graph = {name: sorted(t for t in _imports(name, path, modules) if t in modules and t != name)
             for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycles_at_module_or_function_level():
    cycles = _cycles()
    assert not cycles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _fake_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in {"__init__.py": "", **files}.items():
        (root / "fitjax" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "fitjax" / name).write_text(text)
    return _modules(root / "fitjax")


def test_the_checks_catch_a_real_cycle_and_a_real_upward_import(tmp_path):
    modules = _fake_package(tmp_path, {
        "module/__init__.py": "from fitjax.module._lit_module import LitModule\n",
        "module/_lit_module.py": "from fitjax.module import _lightning\n",
        # the shape the cycle had: an import inside a function, hidden from a top-level scan
        "module/_lightning.py": "def overridden():\n    from fitjax.module import LitModule\n    return LitModule\n",
        "step/__init__.py": "",
        "step/train.py": "import jax\n\ndef late():\n    from fitjax.loop import trainer\n",
        "loop/__init__.py": "",
        "loop/trainer.py": "from fitjax.step import train\n",
        # a package that imports a module by name when first used, which imports the package
        "cli/__init__.py": "import importlib\n_LAZY = {'CLI': 'fitjax.cli._cli'}\n\n"
                           "def __getattr__(name):\n    return importlib.import_module(_LAZY[name])\n",
        "cli/_cli.py": "from fitjax import cli\n",
    })
    assert _cycles(modules) == [["fitjax.cli", "fitjax.cli._cli"], ["fitjax.loop.trainer", "fitjax.step.train"],
                                ["fitjax.module", "fitjax.module._lightning", "fitjax.module._lit_module"]]
    assert _upward_imports(modules) == ["fitjax.step.train (step) imports fitjax.loop.trainer (loop)"]


def _owner(module: str) -> str | None:
    """The package whose private module `module` is (`fitjax.data` for `fitjax.data._checks`,
    `fitjax` for `fitjax._storage`), or None when no part of its name is private."""
    parts = module.split(".")
    for index, part in enumerate(parts[1:], 1):
        if part.startswith("_"):
            return ".".join(parts[:index])
    return None


def _private_imports(modules: dict[str, Path] = MODULES) -> list[str]:
    """Imports of another package's private module: a package's private modules are for that
    package (and the packages inside it); what others use goes through names its `__init__`
    defines (`from fitjax.data import checked_batches`, listed outside `__all__` when it is not
    user-facing API). The top-level private modules (`fitjax._storage`, `fitjax._typing`, ...) are
    the shared utilities of every package."""
    problems = []
    for name, path in sorted(modules.items()):
        for target in sorted(_imports(name, path, modules)):
            owner = _owner(target)
            if owner is not None and name != owner and not name.startswith(owner + "."):
                problems.append(f"{name} imports {target}, a private module of {owner}")
    return problems


def test_no_module_imports_another_packages_private_module():
    problems = _private_imports()
    assert not problems, ("import the name from the package instead (its __init__ exports it):\n"
                          + "\n".join(problems))


def test_the_private_import_check_catches_a_real_one(tmp_path):
    modules = _fake_package(tmp_path, {
        "_storage.py": "",
        "data/__init__.py": "from fitjax.data._checks import checked_batches\n",
        "data/_checks.py": "from fitjax import _storage\n\ndef checked_batches():\n    pass\n",
        "data/_adapters.py": "from fitjax.data import _checks\n",
        # the two spellings of the violation: the module itself, and a name from it
        "loop/__init__.py": "from fitjax.data import _checks\n",
        "loop/trainer.py": "def fit():\n    from fitjax.data._checks import checked_batches\n",
        # through the package's export: allowed
        "loop/evaluation.py": "from fitjax.data import checked_batches\nfrom fitjax import _storage\n",
    })
    assert _private_imports(modules) == [
        "fitjax.loop imports fitjax.data._checks, a private module of fitjax.data",
        "fitjax.loop.trainer imports fitjax.data._checks, a private module of fitjax.data",
    ]


_PRIVATE_TRAINER = re.compile(r"\btrainer\._[A-Za-z]|getattr\(\s*(?:self\.)?trainer\s*,\s*['\"]_")


def _private_trainer_reads(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _PRIVATE_TRAINER.search(line):
                found.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    return found


def test_nothing_outside_the_loop_reads_or_writes_trainer_private_attributes():
    """Callbacks, loggers, the tuner, tests and examples get values and read-only views
    (`trainer.progress`, properties); the `Trainer`'s private attributes belong to `fitjax/loop/`."""
    roots = [PACKAGE.parent / name for name in ("fitjax", "tests", "examples", "benchmarks")]
    loop = PACKAGE / "loop"
    found = [hit for root in roots if root.is_dir() for hit in _private_trainer_reads(root)
             if not hit.startswith(str(loop.relative_to(PACKAGE.parent)) + "/")
             and not hit.startswith("tests/test_layers.py:")]
    assert not found, "reads of Trainer private attributes outside fitjax/loop/:\n" + "\n".join(found)


def test_the_private_attribute_check_catches_one():
    assert _PRIVATE_TRAINER.search("value = trainer._progress.epoch")
    assert _PRIVATE_TRAINER.search('getattr(self.trainer, "_hooks")')
    assert not _PRIVATE_TRAINER.search("value = trainer.progress.epoch")


def _trainer_writes(files: dict[str, str]) -> dict[str, set[str]]:
    """Attribute -> the files (of `files`: name -> source) that write it on the Trainer: `self.X`
    (also `self.X.y` and `self.X[k]`) in the `Trainer` class or a base class of it, and
    `trainer.X` anywhere."""
    trees = {name: ast.parse(source) for name, source in files.items()}
    parts = {"Trainer"} | {base.id for tree in trees.values() for node in ast.walk(tree)
                           if isinstance(node, ast.ClassDef) and node.name == "Trainer"
                           for base in node.bases if isinstance(base, ast.Name)}

    def written(node: ast.AST, owners: set[str]):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in owners:
                        yield sub.attr

    where: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            in_part = isinstance(node, ast.ClassDef) and node.name in parts
            for inner in ast.walk(node) if in_part else ():
                for attr in written(inner, {"self"}):
                    where.setdefault(attr, set()).add(name)
            for attr in written(node, {"trainer"}):
                where.setdefault(attr, set()).add(name)
    return where


def test_each_trainer_attribute_is_written_in_one_file_of_the_loop():
    """The loop's parts are built with what they need and return values: the Trainer's state is
    written by one file each (the loop's `trainer.py` for what lives for a fit), not shared
    through `self` by base classes in several files."""
    files = {p.name: p.read_text() for p in sorted((PACKAGE / "loop").glob("*.py"))}
    shared = {attr: sorted(names) for attr, names in _trainer_writes(files).items() if len(names) > 1}
    assert not shared, f"Trainer attributes written in more than one file of fitjax/loop/: {shared}"


def test_the_shared_write_check_catches_a_base_class_and_a_part_writing_the_trainer():
    files = {"trainer.py": "class Trainer(Logs):\n    def fit(self):\n        self.state = 1\n",
             "logs.py": "class Logs:\n    def log(self):\n        self.state.x = 2\n        self._epoch_acc = {}\n",
             "resume.py": "def resume(trainer):\n    trainer._epoch_acc = {}\n",
             "feed.py": "class Feed:\n    def __init__(self):\n        self.state = 0\n"}
    shared = {attr: names for attr, names in _trainer_writes(files).items() if len(names) > 1}
    assert shared == {"state": {"trainer.py", "logs.py"}, "_epoch_acc": {"logs.py", "resume.py"}}


# the loop's named parts beside `Trainer._train_epoch` and the stage methods
_EPOCH_PARTS = ("_epoch.py", "_stop.py", "evaluation.py", "fit_run.py", "train_feed.py")


def _trainer_reads(source: str) -> list[str]:
    """`line: trainer.X` for each attribute of the name `trainer` that `source` reads or writes
    (handing `trainer` on, to a hook, is not reading it)."""
    return [f"{node.lineno}: trainer.{node.attr}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer"]


def test_the_epoch_parts_never_reach_back_into_the_trainer():
    """The per-batch work, the epoch's end, the stop handling, the evaluations, the fit's run and
    its data receive values and the run object; the Trainer is only handed on to the hooks,
    never read or written there."""
    found = {name: _trainer_reads((PACKAGE / "loop" / name).read_text()) for name in _EPOCH_PARTS}
    assert not any(found.values()), f"the epoch parts read the Trainer: {found}"


def test_the_trainer_read_check_catches_one():
    assert _trainer_reads("def end(trainer, hooks):\n    hooks.call('x', trainer)\n") == []
    assert _trainer_reads("def end(trainer):\n    n = trainer.global_step\n") == ["2: trainer.global_step"]


# The loop reads as one page: `Trainer._train_epoch` is the epoch's outline (its batches, end and
# stop handling are `fitjax.loop._epoch` and `_stop`; the evaluations `evaluation`), and trainer.py
# holds the public surface and the outline only. Only code counts toward the page (issue 63: the
# reference text belongs in the docstrings, beside the signatures): 718 lines of code, 1,240 in
# all, once the Args were back in the docstrings and the 27 read-only attributes plain properties
# (each with a setter saying what to do instead); issue 63 sets the ceiling at 900.
TRAINER_MAX_CODE_LINES = 900
TRAIN_EPOCH_MAX_LINES = 50


def _function_lines(source: str, name: str) -> int:
    (node,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name]
    return node.end_lineno - node.lineno + 1


def _code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not a docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    code = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            code.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(code)


def test_code_lines_count_code_only():
    source = 'def f():\n    """Doc\n    string."""\n    # a comment\n\n    return (1 +\n            2)\n'
    assert _code_lines(source) == 3  # the def and the two lines of the return


def test_the_trainer_and_its_epoch_outline_stay_short():
    source = (PACKAGE / "loop" / "trainer.py").read_text()
    lines = _code_lines(source)
    assert lines <= TRAINER_MAX_CODE_LINES, (
        f"fitjax/loop/trainer.py has {lines} lines of code, over {TRAINER_MAX_CODE_LINES}: move the work into a "
        "named part of fitjax/loop/ (as _epoch, _stop, evaluation)")
    epoch = _function_lines(source, "_train_epoch")
    assert epoch <= TRAIN_EPOCH_MAX_LINES, f"Trainer._train_epoch has {epoch} lines, over {TRAIN_EPOCH_MAX_LINES}"


def _module_privates(source: str) -> set[str]:
    """The private names a `LitModule` has: its `_methods` and the `self._attributes` it sets."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def _module_private_uses(files: dict[str, str], privates: set[str]) -> list[str]:
    """`file:line: x._name` for each use of one of `privates` on anything but `self` or `cls`."""
    found = []
    for name, source in files.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and node.attr in privates and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_nothing_outside_the_module_package_uses_a_litmodule_private_member():
    """The loop, callbacks, checkpoints and tests ask a module through the functions
    `fitjax.module` exports (`overrides`, `hook_mode`, `set_variables`, ...): the names a user's
    subclass may use are the user's, and the module's internals can change in one package."""
    privates = _module_privates((PACKAGE / "module" / "_lit_module.py").read_text())
    room = ast.parse((PACKAGE / "module" / "_weight_room.py").read_text())  # its WeightsMixin, a part of it
    privates |= _module_privates(ast.unparse(next(node for node in room.body
                                                  if isinstance(node, ast.ClassDef) and node.name == "WeightsMixin")))
    assert {"_variables", "_get_binding", "_find_model", "_weights_load", "_lora"} <= privates
    roots = [PACKAGE.parent / name for name in ("fitjax", "tests", "examples", "benchmarks")]
    files = {str(p.relative_to(PACKAGE.parent)): p.read_text() for root in roots if root.is_dir()
             for p in sorted(root.rglob("*.py"))
             if PACKAGE / "module" not in p.parents and p.name != "test_layers.py"}
    found = _module_private_uses(files, privates)
    assert not found, "LitModule private members used outside fitjax/module/:\n" + "\n".join(found)


def test_the_module_private_check_catches_one():
    privates = _module_privates("class LitModule:\n    def _mode(self):\n        self._variables = None\n")
    assert privates == {"_mode", "_variables"}
    files = {"loop.py": "def fit(module):\n    with module._mode():\n        return self._variables\n"}
    assert _module_private_uses(files, privates) == ["loop.py:2: module._mode"]


def test_no_two_test_files_share_a_basename():
    """pytest's default import mode refuses a second `test_x.py` at collection, which stops the whole
    suite before its first test (it happened twice when two folders grew a `test_logging.py`)."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(Path(__file__).parent.rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name]} and {path}")
        seen.setdefault(path.name, path)
    assert not clashes, "test files sharing a basename (rename one): " + "; ".join(clashes)
