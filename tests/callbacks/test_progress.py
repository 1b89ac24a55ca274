"""What the progress bar and the model summary print, captured from their stream."""

from __future__ import annotations

import io
import re
import threading
import time

import jax
import helpers
import numpy as np
import optax
import pytest
import rich.live
import flax.linen as linen
from flax import nnx
from helpers import Regressor, quiet_trainer, regression_data
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fitjax as fj
from fitjax.loop import _log_fetch as fitjax_log_fetch


class Marked(Regressor):
    def loss(self, model, batch):
        pred = model(batch["x"], train=self.training)
        self.log("pred_mean", pred.mean(), prog_bar=True)
        return ((pred - batch["y"]) ** 2).mean(), {"pred": pred}


def _fit_with_bar(**bar_kwargs) -> str:
    out = io.StringIO()
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=4,
                            callbacks=[fj.RichProgressBar(file=out, **bar_kwargs)], enable_progress_bar=True)
    val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
    trainer.fit(Marked(), fj.DataLoader(regression_data(), batch_size=32), val)  # 8 steps/epoch
    trainer.validate(Marked(), val)
    return out.getvalue()


def _joined(text: str) -> str:
    """`text` with each wrapped line (indented: broken between values at 80 columns) joined back
    to the line it continues."""
    return text.replace("\n  ", "  ")


def test_a_non_terminal_gets_plain_lines_per_log_step_and_per_epoch():
    raw = _fit_with_bar()
    # one line a record, however long: no value continues on a line of its own (`grep Epoch` finds all)
    assert not [line for line in raw.splitlines() if line.startswith("  ") and " val/" in line], raw
    assert max(len(line) for line in raw.splitlines()) > 80, raw  # the epoch lines, whole
    text = _joined(raw)
    assert "\x1b" not in text  # no escape codes in a log file
    lines = text.splitlines()
    steps = [line for line in lines if line.startswith("epoch ")]
    assert [re.match(r"epoch (\d) batch (\d)/8 \(optimizer step (\d+)\)  \d+\.\d it/s", s).groups() for s in steps] == [
        ("0", "4", "4"), ("0", "8", "8"), ("1", "4", "12"), ("1", "8", "16")]
    # the loss and the value marked prog_bar=True are shown; the unmarked metric is not
    assert all(" loss " in s and " pred_mean " in s and "mae" not in s for s in steps)
    epochs = [line for line in lines if line.startswith("Epoch ")]
    assert len(epochs) == 2 and all(re.search(r"done in .* loss \S+ .*mae .*val/loss ", e) for e in epochs)
    assert re.search(r"^Validation results  val/loss \S+", text, re.M)
    assert "`Trainer.fit` stopped: `max_epochs=2` reached." in lines  # Lightning's closing line


def test_windows_arriving_together_each_get_their_line(monkeypatch):
    # on a busy machine a log window's values can still be on their way at the next log step, so
    # two windows reach the host at one step boundary (here: each is read only when it must be)
    monkeypatch.setattr(fitjax_log_fetch.Window, "ready", lambda self: False)
    steps = [line for line in _joined(_fit_with_bar()).splitlines() if line.startswith("epoch ")]
    assert [re.match(r"epoch (\d) batch (\d)/8 \(optimizer step (\d+)\)", s).groups() for s in steps] == [
        ("0", "4", "4"), ("0", "8", "8"), ("1", "4", "12"), ("1", "8", "16")]
    # each line shows the values of its own window, not the latest one's
    shown = [re.search(r" pred_mean (\S+)", s).group(1) for s in steps]
    assert len(set(shown)) == 4, steps


def test_a_run_ended_by_max_steps_says_so():
    out = io.StringIO()
    trainer = quiet_trainer(max_epochs=5, max_steps=11, strategy="single", log_every_n_steps=4,
                            callbacks=[fj.RichProgressBar(file=out)], enable_progress_bar=True)
    trainer.fit(Marked(), fj.DataLoader(regression_data(), batch_size=32))  # 8 batches an epoch
    epochs = [line for line in out.getvalue().splitlines() if line.startswith("Epoch ")]
    assert epochs[0].startswith("Epoch 0 done in ") and len(epochs) == 2
    assert re.match(r"Epoch 1 stopped at max_steps=11 after 3/8 batches in \S+ \(optimizer step 11\)", epochs[1])
    assert out.getvalue().splitlines()[-1] == "`Trainer.fit` stopped: `max_steps=11` reached."


def test_the_epoch_max_steps_ends_counts_to_the_batches_left():
    """A 200-step run over 819-batch epochs counts to 200, not to 819: here the second epoch's
    lines count to the 3 batches `max_steps=11` leaves it of 8."""
    out = io.StringIO()
    trainer = quiet_trainer(max_epochs=5, max_steps=11, strategy="single", log_every_n_steps=1,
                            callbacks=[fj.RichProgressBar(file=out)], enable_progress_bar=True)
    trainer.fit(Marked(), fj.DataLoader(regression_data(), batch_size=32))  # 8 batches an epoch
    steps = [re.match(r"epoch (\d) batch (\d+)/(\d+) ", line).groups() for line in out.getvalue().splitlines()
             if line.startswith("epoch ")]
    assert {total for epoch, _, total in steps if epoch == "0"} == {"8"}, steps
    assert [(done, total) for epoch, done, total in steps if epoch == "1"] == [("1", "3"), ("2", "3"), ("3", "3")]


def test_validate_and_test_with_verbose_false_print_no_results_line():
    out = io.StringIO()
    trainer = quiet_trainer(max_epochs=1, strategy="single", callbacks=[fj.RichProgressBar(file=out)],
                            enable_progress_bar=True)
    val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
    module = Marked()
    trainer.fit(module, fj.DataLoader(regression_data(n=64), batch_size=32))
    quiet = trainer.validate(module, val, verbose=False), trainer.test(module, val, verbose=False)
    assert "results" not in out.getvalue()  # Lightning's verbose=False: no results table
    loud = trainer.validate(module, val), trainer.test(module, val)
    assert quiet == loud  # the same values returned either way
    assert re.search(r"^Validation results  ", out.getvalue(), re.M) and re.search(r"^Test results  ", out.getvalue(), re.M)
    with pytest.raises(TypeError, match=r"Trainer.validate\(verbose=...\) takes True or False, got 'no'"):
        trainer.validate(module, val, verbose="no")


def test_a_terminal_gets_a_live_bar():
    text = _fit_with_bar(force_terminal=True, refresh_rate=2)
    assert "\x1b" in text and "Epoch 1/1" in text and "Validation" in text


class _Windows(fj.Callback):
    """Every log window that reached the loggers, as the loop's position records them."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        for position, _, _ in trainer.progress.recent_logged:
            if position not in self.seen:
                self.seen.append(position)

    on_train_epoch_end = lambda self, trainer, module: self.on_train_batch_end(trainer, module, None, None, -1)


@pytest.mark.parametrize("options", [{"accumulate_grad_batches": 2}, {"steps_per_execution": 4}, {}])
def test_plain_lines_between_log_steps_miss_no_window(options):
    """The bar looks for an arrived window only from the batch of the next possible log step on:
    with several batches a step or several steps a call, every window still gets its line."""
    out, windows = io.StringIO(), _Windows()
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=3, enable_progress_bar=True,
                            callbacks=[fj.RichProgressBar(file=out), windows], **options)
    trainer.fit(Marked(), fj.DataLoader(regression_data(n=32 * 24), batch_size=32))  # 24 batches an epoch
    printed = [tuple(map(int, re.match(r"epoch (\d+) batch (\d+)/24 \(optimizer step (\d+)\)", line).groups()))
               for line in _joined(out.getvalue()).splitlines() if line.startswith("epoch ")]
    assert printed == [(p.epoch, p.batches_done, p.step) for p in windows.seen]
    assert len(printed) >= 4


def test_refresh_rate_sets_the_plain_line_interval_and_is_checked():
    steps = [line for line in _fit_with_bar(refresh_rate=8).splitlines() if line.startswith("epoch ")]
    assert len(steps) == 2
    try:
        fj.RichProgressBar(refresh_rate=0)
    except ValueError as err:
        assert "refresh_rate" in str(err) and "0" in str(err)
    else:
        raise AssertionError("refresh_rate=0 was accepted")


class NNXNet(nnx.Module):
    def __init__(self):
        self.hidden = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(16, rngs=nnx.Rngs(0))
        self.out = nnx.Linear(16, 1, rngs=nnx.Rngs(0))

    def __call__(self, x, train=False):
        return self.out(nnx.relu(self.bn(self.hidden(x))))


class NNXRegressor(Regressor):
    def __init__(self):
        super().__init__()
        self.model = NNXNet()


def test_model_summary_at_fit_start_for_linen_and_nnx():
    for module, trainable, names in [(Regressor(), 8 * 32 + 32 + 32 + 32 + 32 + 1, ["Dense_0", "BatchNorm_0"]),
                                     (NNXRegressor(), 8 * 16 + 16 + 16 + 16 + 16 + 1, ["hidden", "bn", "out"])]:
        out = io.StringIO()
        summary = fj.RichModelSummary(file=out, arrays=True)
        quiet_trainer(max_steps=1, strategy="dp", devices=8, callbacks=[summary], enable_model_summary=True).fit(
            module, fj.DataLoader(regression_data(n=32), batch_size=16))
        text = out.getvalue()
        assert summary.summary.trainable_count == trainable
        assert summary.summary.trainable_bytes == 4 * trainable
        assert summary.summary.other_count > 0  # BatchNorm statistics (and NNX rng counters)
        assert all(name in text.replace("\n", "").replace(" ", "").replace("│", "") for name in names)
        assert "Trainable params" in text
        assert "Split" in text and "Per device" in text  # dp over 8 devices: the sharding columns


class _Unsorted(linen.Module):
    @linen.compact
    def __call__(self, x, train: bool = False):
        x = linen.Dense(4, name="zeta")(x)
        x = linen.BatchNorm(use_running_average=not train, name="norm")(x)
        return linen.Dense(1, name="alpha")(x)


class _UnsortedNNX(nnx.Module):
    def __init__(self):
        self.zeta = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
        self.norm = nnx.BatchNorm(4, rngs=nnx.Rngs(0))
        self.alpha = nnx.Linear(4, 1, rngs=nnx.Rngs(0))

    def __call__(self, x, train: bool = False):
        return self.alpha(self.norm(self.zeta(x)))


@pytest.mark.parametrize("net", [_Unsorted, _UnsortedNNX], ids=["linen", "nnx"])
def test_the_summary_lists_layers_in_the_models_order_not_alphabetically(net):
    module = Regressor()
    module.model = net()
    summary = fj.RichModelSummary(file=io.StringIO())
    quiet_trainer(max_steps=1, strategy="single", callbacks=[summary], enable_model_summary=True).fit(
        module, fj.DataLoader(regression_data(n=32), batch_size=16))
    params = [(r.module, r.name) for r in summary.summary.rows if r.collection == "params"]
    assert params == [("zeta", "kernel"), ("zeta", "bias"), ("norm", "scale"), ("norm", "bias"),
                      ("alpha", "kernel"), ("alpha", "bias")]
    stats = [(r.module, r.name) for r in summary.summary.rows if r.collection == "batch_stats"]
    assert stats == [("norm", "mean"), ("norm", "var")]


def test_summary_shows_how_sharded_arrays_are_split():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    kernel = jax.device_put(np.zeros((64, 4), np.float32), NamedSharding(mesh, P("data", None)))
    summary = fj.callbacks.summarize({"Dense_0": {"kernel": kernel}}, {})
    (row,) = summary.rows
    assert (row.module, row.name, row.shape, row.count) == ("Dense_0", "kernel", (64, 4), 256)
    assert row.sharding == "(data, -)" and row.nbytes == 1024 and row.device_bytes == 128
    assert fj.callbacks.summarize({"a": {"b": {"w": np.zeros(3)}, "c": np.zeros(2)}}, {}, max_depth=1).layers[0].params == 5


def test_enable_flags_add_or_remove_the_default_callbacks():
    trainer = fj.Trainer(logger=False)
    # the default checkpoint is a ModelCheckpoint subclass (DefaultCheckpoint: it spaces its saves)
    assert isinstance(trainer.checkpoint_callback, fj.ModelCheckpoint)
    assert {type(cb) for cb in trainer.callbacks} == {fj.RichProgressBar, fj.RichModelSummary,
                                                      type(trainer.checkpoint_callback)}
    trainer = fj.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, callbacks=[fj.RichModelSummary(max_depth=1)])
    assert trainer.callbacks == []


# ------------------------------------------------ what a user sees in a 120-column terminal

class LitStyle(fj.LitModule):
    """A Lightning-shaped module: Lightning's key names, no `val/` or `test/` prefix."""

    def __init__(self):
        super().__init__()
        self.model = helpers.MLP()

    def training_step(self, batch, batch_idx):
        pred = self.model(batch["x"], train=self.training)
        self.log("train_mae", abs(pred - batch["y"]).mean(), on_step=True, on_epoch=True)
        return ((pred - batch["y"]) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        pred = self.model(batch["x"], train=False)
        self.log("val_mae", abs(pred - batch["y"]).mean())
        self.log("val_mse", ((pred - batch["y"]) ** 2).mean(), prog_bar=True)

    def test_step(self, batch, batch_idx):
        self.log("test_mae", abs(self.model(batch["x"], train=False) - batch["y"]).mean())

    def configure_optimizers(self):
        return optax.sgd(0.05)


def _recorded_bar(*, terminal: bool) -> fj.RichProgressBar:
    return fj.RichProgressBar(force_terminal=terminal, console_kwargs={
        "record": True, "width": 120, "height": 40, "file": io.StringIO()})


_CONTROL = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z]|\r|\n)")


def _screen(raw: str, width: int = 120) -> list[str]:
    """The lines a 120-column terminal shows after `raw` (scrollback included): the cursor moves
    and line erasures rich's live display uses are applied, colours dropped."""
    lines, row, col = [""], 0, 0
    for token in _CONTROL.split(raw):
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
        elif token.startswith("\x1b["):
            if token.endswith("A"):  # cursor up
                row -= int(token[2:-1] or 1)
            elif token.endswith("K"):  # erase the line
                lines[row] = ""
            else:
                assert token.endswith(("m", "h", "l")), f"unexpected control {token!r}"
        else:
            for char in token:
                if col == width:  # the terminal wraps a line longer than its width
                    row, col = row + 1, 0
                while len(lines) <= row:
                    lines.append("")
                lines[row] = lines[row][:col].ljust(col) + char + lines[row][col + 1:]
                col += 1
        while len(lines) <= row:
            lines.append("")
    return [line.rstrip() for line in lines]


class Screen(fj.Callback):
    """After the bar's own hooks, looks at the terminal at the moments a user waits: before the
    first train step (it compiles), after it, and around the first validation."""

    def __init__(self, bar):
        self.bar, self.seen = bar, {}

    def _look(self, moment):
        self.seen.setdefault(moment, _screen(self.bar.console.file.getvalue()))
        threads = [t for t in threading.enumerate() if isinstance(t, rich.live._RefreshThread)]
        assert not threads, "a thread redraws the bar while the loop prints"

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._look("before the first train step")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._look("after the first train step")

    def on_validation_start(self, trainer, module):
        self._look("before the first validation step")

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._look("after the first validation step")


def test_a_terminal_says_what_compiles_and_keeps_every_epoch_line():
    bar = _recorded_bar(terminal=True)
    screen = Screen(bar)
    trainer = quiet_trainer(max_epochs=3, strategy="dp", callbacks=[bar, screen], enable_progress_bar=True,
                            num_sanity_val_steps=0)  # the first validation after the first train step
    val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
    trainer.fit(Marked(), fj.DataLoader(regression_data(n=128), batch_size=32), val)  # 4 steps/epoch
    seen = screen.seen
    # the bar's row, then its values (here the note) on a line of their own
    assert re.match(r"Epoch 0/2 .* 0/4 ", seen["before the first train step"][-2])
    assert seen["before the first train step"][-1] == "compiling train step"
    assert re.match(r"Epoch 0/2 .* 1/4 .* it/s", seen["after the first train step"][-2])
    first_validation = r"(Validation|Sanity Checking)"  # Lightning's sanity check, if the loop runs one
    assert any(re.match(first_validation + r" .* 0/2 ", line) for line in seen["before the first validation step"])
    assert seen["before the first validation step"][-1] == "compiling validation step"
    assert any(re.match(first_validation + r" .* 1/2 ", line) for line in seen["after the first validation step"])
    assert not any("compiling" in line for line in seen["after the first validation step"])
    shown = _screen(bar.console.file.getvalue())
    done = [line for line in _joined("\n".join(shown)).splitlines() if line.startswith("Epoch ") and " done " in line]
    assert [re.match(r"Epoch (\d) done in \S+ \(optimizer step (\d+)\)  loss ", line).groups() for line in done] == [
        ("0", "4"), ("1", "8"), ("2", "12")]
    assert all(f"  {key} " in line for line in done for key in ("mae", "pred_mean", "val/loss", "val/mae"))
    assert max(len(line) for line in shown) <= 120
    lines = [line for line in shown if line]
    closing, last_bar = lines[-1], max(i for i, line in enumerate(lines) if line.startswith("Epoch 2/2"))
    assert re.match(r"Epoch 2/2 .* 4/4 .* \d+\.\d it/s$", lines[last_bar])  # the last bar stays
    assert lines[last_bar + 1].startswith("val/loss ")  # its values under it (no train window was logged)
    assert closing == "`Trainer.fit` stopped: `max_epochs=3` reached."


def test_lightning_style_values_reach_the_epoch_lines_and_the_results():
    bar = _recorded_bar(terminal=False)
    trainer = quiet_trainer(max_epochs=2, strategy="single", callbacks=[bar], enable_progress_bar=True)
    val = fj.DataLoader(regression_data(n=64, seed=1), batch_size=32)
    module = LitStyle()
    trainer.fit(module, fj.DataLoader(regression_data(n=64), batch_size=32), val)
    trainer.validate(module, val)
    trainer.test(module, val)
    text = _joined(bar.console.export_text())
    epochs = re.findall(r"^Epoch \d done .*$", text, re.M)
    assert len(epochs) == 2
    for line in epochs:  # the train epoch means, then every value the validation logged
        assert re.search(r"\)  loss \S+  train_mae_epoch \S+  val_mae \S+  val_mse \S+$", line), line
    (validated,) = re.findall(r"^Validation results  .*$", text, re.M)
    assert re.fullmatch(r"Validation results  val_mae \S+  val_mse \S+", validated)
    (tested,) = re.findall(r"^Test results  .*$", text, re.M)
    assert re.fullmatch(r"Test results  test_mae \S+", tested)
    assert text.count("compiling train step") == 1


def test_the_array_summary_fits_80_columns_and_names_nnx_state_kinds():
    summary = fj.RichModelSummary(arrays=True, console_kwargs={"record": True, "width": 80, "file": io.StringIO()})
    quiet_trainer(max_steps=1, strategy="fsdp", callbacks=[summary], enable_model_summary=True).fit(
        NNXRegressor(), fj.DataLoader(regression_data(n=32), batch_size=16))
    lines = summary.console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80 and "…" not in "".join(lines)
    assert lines[-4:-1] == ["193       Trainable params (772 B)", "32        Other state (128 B)",
                            "225       Total (900 B)"]
    assert lines[-1].strip() == "Optimizer state (772 B, in device memory)"
    rows = {(row.module, row.name, row.collection) for row in summary.summary.rows}
    assert {("bn", "mean", "batch_stats"), ("bn", "var", "batch_stats"), ("hidden", "kernel", "params")} <= rows
    assert "batch_" in "".join(lines)  # shown (folded in its cell at 80 columns on a mesh)


class _SlowSteps(fj.Callback):
    """Each train step of epoch 0 takes ~25 ms more (a slow model, as the bar sees it)."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.current_epoch == 0:
            time.sleep(0.025)


def test_the_live_bar_redraws_on_its_clock_between_steps_not_at_every_step():
    bar = _recorded_bar(terminal=True)
    trainer = quiet_trainer(max_epochs=2, strategy="single", callbacks=[bar, _SlowSteps()],
                            enable_progress_bar=True, num_sanity_val_steps=0)
    trainer.fit(Regressor(), fj.DataLoader(regression_data(n=32 * 24), batch_size=32))  # 24 steps/epoch
    raw = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bar.console.file.getvalue())  # colours, cursor moves
    # every count a redraw showed, per epoch: epoch 0's 24 steps last ~0.6 s, so its 10 Hz clock
    # draws ~6 counts between the first step and the last; epoch 1's fast steps draw ~none
    drawn = {epoch: {int(n) for n in re.findall(rf"Epoch {epoch}/1 .*? +(\d+)/24 ", raw)} for epoch in (0, 1)}
    middle = {epoch: {n for n in counts if 1 < n < 24} for epoch, counts in drawn.items()}
    assert 3 <= len(middle[0]) <= 16, drawn[0]  # on the clock: not every step (22), not only the ends
    assert 24 in drawn[0] and 24 in drawn[1]  # each epoch's last batch is drawn
    assert len(middle[1]) <= 3, drawn[1]


class _StopAndSummarise(fj.Callback):
    """Before the bar in the list (as a user's callback is before the default bar): stops the fit
    at step 11 when `stop`, and prints a summary at `on_train_end` on the bar's console."""

    def __init__(self, bar, stop: bool):
        self.bar, self.stop = bar, stop

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.stop and trainer.global_step == 11:
            trainer.should_stop = True

    def on_train_end(self, trainer, module):
        self.bar.console.print("SUMMARY")


@pytest.mark.parametrize("stop", [False, True])
def test_the_bar_is_closed_before_the_summaries_at_the_end_of_training(stop):
    """The live bar closes when the train batches end, so on_train_end's summaries and fit's closing
    line print below its last state (a live bar was redrawn under each of them); a stop between two
    redraws leaves the bar at the batch it stopped at (it showed 0/8 here)."""
    bar = _recorded_bar(terminal=True)
    trainer = quiet_trainer(max_epochs=2, strategy="single", callbacks=[_StopAndSummarise(bar, stop), bar],
                            enable_progress_bar=True)
    trainer.fit(Marked(), fj.DataLoader(regression_data(), batch_size=32))  # 8 batches an epoch
    lines = [line for line in _screen(bar.console.file.getvalue()) if line]
    bars = [i for i, line in enumerate(lines) if line.startswith("Epoch 1/1 ")]
    assert len(bars) == 1 and re.match(r"Epoch 1/1 .* 3/8 " if stop else r"Epoch 1/1 .* 8/8 ", lines[bars[0]]), lines
    closing = [] if stop else ["`Trainer.fit` stopped: `max_epochs=2` reached."]
    assert lines[lines.index("SUMMARY"):] == ["SUMMARY", *closing] and bars[0] < lines.index("SUMMARY"), lines
