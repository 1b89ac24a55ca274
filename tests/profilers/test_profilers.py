"""Profilers in real fits: the simple profiler's phases and table, the JAX trace TensorBoard reads,
compile times in the logs, and nothing changed on the per-step path when no profiler is on."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from helpers import Regressor, regression_data

import fitjax as fj
from fitjax.callbacks._base import CallbackList
from fitjax.profilers import JaxProfiler, PassThroughProfiler, SimpleProfiler


def _data():
    return (fj.DataLoader(regression_data(n=128), batch_size=32),  # 4 batches an epoch
            fj.DataLoader(regression_data(n=64, seed=1), batch_size=32))


def test_simple_profiler_times_each_phase_of_a_dp_fit_prints_and_writes_the_table(tmp_path, capsys):
    # compile_cache=False: the compile seconds asserted below are compilations, never a program
    # an earlier test stored and this fit reads back in under `CompileTimes.MIN_SECONDS`
    trainer = fj.Trainer(max_epochs=2, strategy="dp", profiler="simple", logger=fj.CSVLogger(tmp_path),
                         log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                         compile_cache=False)
    trainer.fit(Regressor(), *_data())

    recorded = trainer.profiler.recorded
    calls = {name: len(times) for name, times in recorded.items()}
    assert calls["[step] dispatch"] == 8
    assert calls["[data] next batch"] == 8 + 2  # and the call that ends each epoch
    assert calls["[loop] validation"] == 2
    assert calls["[build] state and programs"] == 1
    # the checkpoint saves (the default checkpoint callback is a ModelCheckpoint subclass)
    assert calls[f"[Callback]{type(trainer.checkpoint_callback).__name__}.on_train_epoch_end"] == 2
    assert calls["[sync] log step values"] >= 4
    assert calls["[log] loggers"] >= 4
    assert {"[compile] train_step", "[compile] eval_step"} <= set(calls)
    assert all(t >= 0 for times in recorded.values() for t in times)

    report = (Path(trainer.log_dir) / "fit-profile.txt").read_text()
    assert report.startswith("FIT profiler report (host wall time)")
    for name in ("[step] dispatch", "[data] next batch", "[loop] validation", "[compile] train_step"):
        assert name in report
    assert report.strip() in capsys.readouterr().out
    # the phases' shares (self time, with [other]) sum to 100%; compiles are a block apart
    phase_block = report.split("XLA compiles")[0].splitlines()[4:]  # after the title, header, rule, Total
    shares = [float(line.rsplit("|", 1)[1].strip().rstrip("%")) for line in phase_block]
    assert sum(shares) == pytest.approx(100.0, abs=0.1 * len(shares))
    assert "[other] in no phase" in report and report.count("[compile] ") <= 8
    own = trainer.profiler.self_time
    assert own["[loop] validation"] < sum(recorded["[loop] validation"])  # its callbacks and logs not counted twice

    # Every fit logs each program's compile seconds, profiler or not, with the next values.
    with (Path(trainer.log_dir) / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    compiled = {k: float(v) for row in rows for k, v in row.items() if k.startswith("compile/") and v}
    assert compiled["compile/train_step_s"] > 0 and compiled["compile/eval_step_s"] > 0
    assert trainer.logged_metrics["compile/train_step_s"] == compiled["compile/train_step_s"]
    assert not any(key.startswith("compile/") for key in trainer.callback_metrics)  # not the progress bar's


def test_jax_profiler_traces_the_chosen_steps_where_tensorboard_finds_them(tmp_path):
    profiler = JaxProfiler(start_step=1, num_steps=2)
    trainer = fj.Trainer(max_epochs=1, strategy="fsdp", profiler=profiler, default_root_dir=tmp_path,
                         log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), *_data())

    (run,) = (Path(trainer.log_dir) / "plugins" / "profile").iterdir()
    assert profiler.trace_dir == run
    assert list(run.glob("*.xplane.pb"))  # what TensorBoard's profile plugin reads
    (trace,) = run.glob("*.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")
    assert steps == [1, 2]
    assert "[data] next batch" in {e.get("name") for e in events}  # phases, named, while tracing


class _Wide(fj.LitModule):
    """A step of a few milliseconds: long enough that its device work outlasts its dispatch."""

    def __init__(self):
        super().__init__()
        self.model = nn.Sequential([nn.Dense(384), nn.relu, nn.Dense(384), nn.relu, nn.Dense(1)])

    def loss(self, model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def configure_optimizer(self):
        return optax.sgd(1e-3)


def test_each_traced_step_marker_spans_its_device_work(tmp_path):
    # XProf's step-time graph and "Average Step Time" are the markers' durations: a marker around
    # the asynchronous dispatch alone showed 0.2 ms for a 5 ms step
    profiler = JaxProfiler(start_step=2, num_steps=3)
    trainer = fj.Trainer(max_epochs=1, strategy="single", profiler=profiler, default_root_dir=tmp_path,
                         log_every_n_steps=4, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    x = np.random.default_rng(0).normal(size=(1024, 64)).astype("float32")
    trainer.fit(_Wide(), fj.DataLoader({"x": x, "y": x[:, :1]}, batch_size=128))
    (trace,) = profiler.trace_dir.glob("*.trace.json.gz")
    events = [e for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    markers = [e for e in events if e["name"] == "train"]
    runs = [e for e in events if e["name"] == "ThunkExecutor::Execute"]  # XLA:CPU running a program
    assert len(markers) == 3
    for marker in markers:
        start, end = marker["ts"], marker["ts"] + marker["dur"]
        inside = [r for r in runs if start <= r["ts"] <= end]
        assert inside, "no device work inside the step's marker"
        # the work started in a step ends in it (XLA:CPU can close an execution's range after its
        # results are ready, later on a loaded machine: half a step is allowed; a marker around
        # the dispatch alone ended many of its own lengths before its step's work did)
        overrun = max(r["ts"] + r["dur"] for r in inside) - end
        print(f"step {marker['args']['step_num']}: {marker['dur']:.0f} us, work ends {overrun:.0f} us after it")
        assert overrun <= 0.5 * marker["dur"], (overrun, marker, inside)


def test_no_profiler_leaves_the_step_data_and_hooks_as_they_are():
    trainer = fj.Trainer()
    assert isinstance(trainer.profiler, PassThroughProfiler)
    step, batches, hooks = (lambda s, b: (s, b)), [1, 2], CallbackList([fj.ModelCheckpoint()])
    assert trainer.profiler.wrap_step(step) is step
    assert trainer.profiler.wrap_batches(batches) is batches
    assert trainer.profiler.wrap_hooks(hooks) is hooks


def test_profiler_arguments_are_checked():
    assert isinstance(fj.Trainer(profiler="simple").profiler, SimpleProfiler)
    with pytest.raises(ValueError, match=r"profiler=.*'simple'.*'jax'.*got 'pytorch'"):
        fj.Trainer(profiler="pytorch")
    with pytest.raises(ValueError, match=r"num_steps=.*>= 1; got 0"):
        JaxProfiler(num_steps=0)


def test_compile_times_count_one_entry_per_xla_compilation():
    """Each compilation is one entry (its trace, lowering and compile seconds together), so the
    simple profiler's `[compile]` rows count compilations, not JAX's three events of each."""
    from fitjax.profilers import CompileTimes

    def add_two(x):
        return x + 2

    step = jax.jit(add_two)
    with CompileTimes() as times:
        step(np.ones(3, np.float32))
        step(np.ones(3, np.float32))  # cached: no compilation
        step(np.ones(5, np.float32))  # a new shape: a second one
    entries = times.take_each()["add_two"]
    assert len(entries) == 2 and all(seconds > 0 for seconds in entries)
