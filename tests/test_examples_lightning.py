"""The Lightning-style examples, each trained here to its stated bar."""

from __future__ import annotations

import helpers  # noqa: F401  (puts examples/ on the path)
import lightning_autoencoder
import lightning_classifier
import lightning_gan
import numpy as np


def test_lightning_classifier_with_a_datamodule_reaches_95_percent(tmp_path):
    results = lightning_classifier.main(["--epochs", "12", "--no-progress-bar", "--root-dir", str(tmp_path)])
    assert results["val_acc"] >= 0.95 and results["test_acc"] >= 0.95
    # ModelCheckpoint(monitor="val_acc") found the Lightning-style key
    assert list((tmp_path / "fitjax_logs" / "version_0" / "checkpoints").iterdir())


def test_lightning_autoencoder_reconstructs_held_out_digits(tmp_path):
    _, val = lightning_autoencoder.digits_pixels()
    baseline = float(((val - val.mean(0)) ** 2).mean())  # predicting the mean image
    results = lightning_autoencoder.main(["--epochs", "12", "--no-progress-bar", "--root-dir", str(tmp_path)])
    assert results["val_mse"] < 0.02 < 0.3 * baseline
    assert results["embedding_dim"] == 16  # predict runs `forward`: the encoder


def test_lightning_gan_with_manual_optimization_matches_the_target_moments(tmp_path):
    results = lightning_gan.main(["--epochs", "20", "--no-progress-bar", "--root-dir", str(tmp_path)])
    np.testing.assert_allclose(results["mean"], lightning_gan.TARGET_MEAN, atol=0.25)
    np.testing.assert_allclose(results["std"], lightning_gan.TARGET_STD, rtol=0.3)
