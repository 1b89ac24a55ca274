"""JAX's privates are reached in one module only (`fitjax._jax_compat`), and each of its functions
answers on the installed JAX (the release it says it was checked with, on CI and here)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import jax
import pytest

from fitjax import _jax_compat

PACKAGE = Path(__file__).resolve().parents[1] / "fitjax"
# `jax._src` as a module name, or as a path ("jax/_src", `os.path.join("jax", "_src", ...)`)
PRIVATE = re.compile(r"""jax[./\\]_src|["']jax["']\s*,\s*["']_src["']""")


def test_no_module_but_the_compat_module_names_jax_privates():
    named = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                   if path.name != "_jax_compat.py" and PRIVATE.search(path.read_text()))
    assert named == []


def test_the_scan_finds_each_spelling(tmp_path):
    # the check above can fail: each way a module may name the privates is caught
    for text in ("from jax._src import xla_bridge", "import jax._src.config", '"jax/_src/compiler.py"',
                 'os.path.join("jax", "_src", "callback.py")'):
        assert PRIVATE.search(text), text
    assert not PRIVATE.search("from qwix._src.providers import ptq")


def test_the_backends_and_their_factories():
    jax.devices()  # the suite's backends: started
    assert _jax_compat.backends_started() is True
    factories = _jax_compat.backend_factories()
    assert "cpu" in factories and callable(factories["cpu"].factory)


def test_the_frames_ctrl_c_matches_are_jaxs_files():
    compiler = Path(jax.__file__).parent / "_src" / "compiler.py"
    callback = Path(jax.__file__).parent / "_src" / "callback.py"
    assert str(compiler).endswith(_jax_compat.COMPILE_FILE) and str(callback).endswith(_jax_compat.CALLBACK_FILE)
    compiler_text, callback_text = compiler.read_text(), callback.read_text()
    # one of the names a release; the callback is a function local to where XLA calls it
    assert any(f"def {name}(" in compiler_text for name in _jax_compat.COMPILE_FUNCTIONS)
    assert f"def {_jax_compat.CALLBACK_FUNCTION}(" in callback_text


def test_the_distributed_client_is_none_without_jax_distributed():
    assert _jax_compat.distributed_client() is None


def test_the_scoped_options_rules_and_cost_analysis_are_there():
    assert callable(_jax_compat.threefry_gpu_kernel_lowering())
    assert jax.lax.conv_general_dilated_p in _jax_compat.batching_rules()
    from jaxlib import _hlo

    compiled = jax.jit(lambda x: x @ x).lower(jax.numpy.ones((8, 8))).compile()
    module = _hlo.hlo_module_from_text(compiled.as_text())
    client = jax.local_devices(backend="cpu")[0].client
    assert _jax_compat.hlo_module_cost_analysis(client, module)["flops"] == pytest.approx(2 * 8 ** 3, rel=0.1)
    assert _jax_compat.tpu_chips_on_pci() in (None, *range(0, 64))


def test_the_plugin_profiler_is_restored():
    from jax._src import xla_bridge

    register = xla_bridge._profiler.register_plugin_profiler
    with _jax_compat.plugin_profiler_not_registered():
        assert xla_bridge._profiler.register_plugin_profiler is not register
    assert xla_bridge._profiler.register_plugin_profiler is register


def test_a_moved_private_is_an_import_error_naming_the_checked_release():
    with pytest.raises(_jax_compat.JaxPrivateMissing, match=r"jax\._src\.no_such_module .*checked with jax "
                       + re.escape(_jax_compat.CHECKED_WITH)) as caught:
        _jax_compat._private("no_such_module", "a test")
    assert isinstance(caught.value, ImportError)  # callers that fall back on ImportError still do
    assert os.sep in _jax_compat.COMPILE_FILE or "/" in _jax_compat.COMPILE_FILE
