"""What fit says and traces while it sets up: one status line for the init and each step's
compilation, with its time; the user's function traced as few times as the build needs
(docs/guides/speed.md says why each trace remains: a `print` in `loss` shows each one)."""

from __future__ import annotations

import io
import re

import optax
import pytest
from helpers import MLP, regression_data

import fitjax as fj


class Counted(fj.LitModule):
    """Squared error of an MLP with BatchNorm whose `loss` counts its calls (each is a trace:
    compiled code does not run Python)."""

    def __init__(self):
        super().__init__()
        self.model = MLP(width=8)
        self.traces = 0

    def loss(self, model, batch):
        self.traces += 1
        return ((model(batch["x"], train=self.training) - batch["y"]) ** 2).mean()

    def metrics(self, batch, outputs):
        return {"y_size": abs(batch["y"]).mean()}

    def configure_optimizer(self):
        return optax.sgd(0.1)


class Snapshots(fj.Callback):
    """The module's trace count when each phase of the fit starts."""

    def __init__(self):
        self.at = {}

    def on_fit_start(self, trainer, module):
        self.at["built"] = module.traces

    def on_train_start(self, trainer, module):
        self.at["sanity checked"] = module.traces

    def on_train_epoch_end(self, trainer, module):
        self.at[f"epoch {trainer.current_epoch}"] = module.traces


def test_a_fit_traces_loss_five_times_and_never_again_after_the_first_steps(capsys):
    module, snapshots = Counted(), Snapshots()
    trainer = fj.Trainer(max_epochs=2, strategy="single", enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, logger=False, callbacks=[snapshots])
    trainer.fit(module, fj.DataLoader(regression_data(n=32), batch_size=16),
                fj.DataLoader(regression_data(n=16, seed=1), batch_size=16))
    assert snapshots.at == {
        # the names and checks: Linen's init (train mode) and eval mode, in one abstract trace;
        # then the init program, whose trace `jax.eval_shape` (the shardings) and the jit share
        "built": 3,
        "sanity checked": 4,  # the eval step
        "epoch 0": 5,  # the train step
        "epoch 1": 5,  # nothing traced again
    }
    # not a terminal (captured): each phase's line once, when it ends, with its time
    said = re.findall(r"^fitjax: (.*) in \d+\.\d s$", capsys.readouterr().out, re.M)
    assert said == ["initialised the state", "compiled the evaluation step", "compiled the train step"]


class CountedSteps(fj.LitModule):
    """Lightning-style steps (a `test_step` too: the test stage's names are traced at the build)
    that count their calls."""

    def __init__(self):
        super().__init__()
        self.model = MLP(width=8)
        self.traces = {"training_step": 0, "validation_step": 0, "test_step": 0}

    def forward(self, x):
        return self.model(x, train=self.training)

    def _error(self, batch, step):
        self.traces[step] += 1
        return ((self(batch["x"]) - batch["y"]) ** 2).mean()

    def training_step(self, batch, batch_idx):
        return self._error(batch, "training_step")

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._error(batch, "validation_step"))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self._error(batch, "test_step"))

    def configure_optimizers(self):
        return optax.sgd(0.1)


class BeforeTraining(fj.Callback):
    def on_train_start(self, trainer, module):
        self.traces = dict(module.traces)


def test_on_a_terminal_each_status_line_shows_while_its_phase_runs_and_ends_with_its_time():
    out, before = io.StringIO(), BeforeTraining()
    trainer = fj.Trainer(max_epochs=1, strategy="single", enable_model_summary=False, enable_checkpointing=False,
                         logger=False, callbacks=[fj.RichProgressBar(file=out, force_terminal=True), before])
    trainer.fit(CountedSteps(), fj.DataLoader(regression_data(n=32), batch_size=16),
                fj.DataLoader(regression_data(n=16, seed=1), batch_size=16))
    # the build calls training_step twice (Linen's init finding the names; the init program), the
    # other stages' names are traced in eval mode alone (7 training_step calls before, as issue 35 saw)
    assert before.traces == {"training_step": 2, "validation_step": 2, "test_step": 1}
    drawn = out.getvalue()
    # shown while the init runs, then replaced in place by the line with its time
    assert re.search(r"fitjax: initialising the state…\r\x1b\[2Kfitjax: initialised the state in \d+\.\d s\n", drawn)
    # the train step compiles under the drawn bar (its row says so); the line is printed above it
    compiled = drawn.index("fitjax: compiled the train step in ")
    assert drawn.index("compiling train step") < compiled < drawn.rindex("Epoch 0")


class Predicting(CountedSteps):
    def predict_step(self, batch, batch_idx):
        return self(batch["x"])


@pytest.mark.filterwarnings("ignore:.*never fitted nor loaded")
def test_validate_test_and_predict_on_their_own_say_their_set_up_as_fit_does(capsys):
    module = Predicting()
    trainer = fj.Trainer(strategy="single", enable_progress_bar=False, logger=False)
    data = fj.DataLoader(regression_data(n=16), batch_size=16)
    said = {}
    for stage in (trainer.validate, trainer.test, trainer.predict):
        stage(module, data)
        said[stage.__name__] = re.findall(r"^fitjax: (.*) in \d+\.\d s$", capsys.readouterr().out, re.M)
    assert said == {"validate": ["initialised the state", "compiled the evaluation step"],
                    "test": ["initialised the state", "compiled the evaluation step"],
                    "predict": ["initialised the state", "compiled the predict step"]}


def test_the_flop_count_reads_the_step_that_ran_and_a_count_before_it_is_said_as_a_count(capsys):
    """`ThroughputMonitor`'s FLOP count is XLA's analysis of the train step the loop compiled:
    "compiled the train step" is said once and nothing else compiles (the count compiled the
    step a second time before, ~15% of the tiny GPT's fit). Read before any step ran
    (`on_fit_start`), the count compiles the step on its own, and its line says so, not as a
    second compilation of the train step."""
    def fit(*callbacks):
        trainer = fj.Trainer(max_steps=3, strategy="single", enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, logger=False, log_every_n_steps=1, callbacks=list(callbacks))
        trainer.fit(Counted(), fj.DataLoader(regression_data(n=32), batch_size=8))
        return trainer, re.findall(r"^fitjax: (.*) in \d+\.\d s$", capsys.readouterr().out, re.M)

    monitor = fj.ThroughputMonitor(batch_size_fn=lambda b: b["x"].shape[0], window_size=2)
    ran, said = fit(monitor)
    assert said == ["initialised the state", "compiled the train step"], said
    assert monitor.metrics["train/device/flops_per_sec"] > 0

    class Early(fj.Callback):
        def on_fit_start(self, trainer, module):
            self.flops = trainer.train_step_flops()

    early = Early()
    _, said = fit(early)
    assert said.count("compiled the train step") == 1 and "counted the train step's FLOPs" in said, said
    assert early.flops == pytest.approx(ran.train_step_flops(), rel=1e-2)  # the batches' pick: a few FLOPs
