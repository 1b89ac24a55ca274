"""The attention kernel's choice (`fitjax.nn._kernels`): the argument, which the environment only
overrides (on TPU programs), and the splash kernel's blocks."""

import pytest

from fitjax.nn import _kernels
from fitjax.nn._kernels import Choice, SplashBlocks


@pytest.mark.parametrize("lengths, head_dim, largest, expected", [
    ((1024, 1024), 64, None, SplashBlocks(512, 512)),
    ((384, 1280), 128, None, SplashBlocks(384, 256)),
    ((1024, 1024), 64, "256", SplashBlocks(256, 256)),
    ((1000, 1000), 64, None, None),
    ((1024, 1024), 48, None, None),
])
def test_splash_blocks_divide_the_lengths(monkeypatch, lengths, head_dim, largest, expected):
    if largest is None:
        monkeypatch.delenv(_kernels.BLOCK_ENV, raising=False)
    else:
        monkeypatch.setenv(_kernels.BLOCK_ENV, largest)
    assert _kernels.splash_blocks(*lengths, head_dim) == expected


def test_the_argument_chooses_and_the_environment_overrides_it_on_tpu_only(monkeypatch):
    monkeypatch.delenv(_kernels.ATTENTION_ENV, raising=False)
    assert _kernels.attention_kernel("auto", "tpu") == Choice("auto")
    assert _kernels.attention_kernel("xla", "tpu") == Choice("xla")
    assert _kernels.attention_kernel("pallas-fused", "cpu") == Choice("pallas", fused_backward=True)
    monkeypatch.setenv(_kernels.ATTENTION_ENV, "xla")
    assert _kernels.attention_kernel("pallas", "tpu") == Choice("xla")
    assert _kernels.attention_kernel("pallas", "cpu") == Choice("pallas")  # a TPU variable: TPU programs only
    monkeypatch.setenv(_kernels.ATTENTION_ENV, "splash-fused")
    assert _kernels.attention_kernel("xla", "tpu") == Choice("auto", fused_backward=True)
    assert _kernels.attention_kernel("pallas", "tpu") == Choice("pallas", fused_backward=True)
    assert _kernels.attention_kernel("cudnn", "tpu") == Choice("cudnn")
    monkeypatch.setenv(_kernels.ATTENTION_ENV, "flash")
    with pytest.raises(ValueError, match="'splash', 'splash-fused', 'xla'"):
        _kernels.attention_kernel("auto", "tpu")
