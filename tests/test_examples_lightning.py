"""The Lightning-style examples, each trained here to its stated bar."""

from __future__ import annotations

import helpers  # noqa: F401  (puts examples/ on the path)
import dqn
import lightning_autoencoder
import lightning_classifier
import lightning_gan
import lightning_gan_images
import lightning_imagenet
import numpy as np


def test_dqn_template_learns_cartpole_with_the_environment_stepped_in_host_hooks(tmp_path):
    results = dqn.main(["--max-steps", "1500", "--no-progress-bar", "--root-dir", str(tmp_path)])
    # random play (the warm start's) lasts ~22 steps an episode; 116 measured at 1500 steps
    assert results["best_return"] >= 100
    assert results["last_10_mean"] >= 2 * 22


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


def test_lightning_imagenet_example_under_lightning_cli_and_test_from_the_best_checkpoint(tmp_path):
    # Lightning's imagenet.py as written: the module's own setup/loaders (torch DataLoaders), SGD
    # with weight decay + a step-decay scheduler as `[optimizer], [scheduler]`, LightningCLI with
    # benchmark=True, TQDMProgressBar, ModelCheckpoint(monitor="val_acc1") and seed_everything_default
    cli = lightning_imagenet.main(["fit", "--trainer.max_epochs=5", "--trainer.enable_progress_bar=false",
                                   "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={tmp_path}"])
    best = cli.trainer.checkpoint_callback
    assert cli.config["fit"]["seed_everything"] == 42 and cli.trainer.seed == 42
    assert float(best.best_model_score) >= 0.85  # 0.924 measured (epoch 4)
    [results] = cli.trainer.test(ckpt_path="best")  # no model, no data: the fitted module's own loaders
    assert results["test_acc1"] == float(best.best_model_score)  # the test split is the val split


def test_lightning_gan_template_samples_every_digit_and_logs_them_each_epoch(tmp_path):
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    digits = load_digits()
    classifier = LogisticRegression(max_iter=2000).fit(digits.data / 8.0 - 1.0, digits.target)
    model = lightning_gan_images.main(lightning_gan_images.parse_args(
        ["--epochs", "15", "--no-progress-bar", "--root-dir", str(tmp_path)]))
    z = np.random.default_rng(1).normal(size=(500, 100)).astype(np.float32)
    samples = np.asarray(model(z)).reshape(500, -1)  # after fit: the trained generator
    probabilities = classifier.predict_proba(samples)
    # 15 epochs: every class 26-79 of 500, mean confidence 0.71 (real digits: 0.96)
    assert np.bincount(probabilities.argmax(1), minlength=10).min() >= 10
    assert probabilities.max(1).mean() >= 0.6
    # on_train_epoch_end's `self(z)` -> `logger.experiment.add_image(..., self.current_epoch)`
    events = EventAccumulator(str(next((tmp_path / "fitjax_logs").iterdir())), size_guidance={"images": 0})
    events.Reload()
    assert [e.step for e in events.Images("generated_images")] == list(range(15))
