"""Log windows held on the device and sent to the host stacked (`fitjax.loop._log_fetch`): what
an accelerator's fit does with windows that come fast, here forced on CPU's devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Regressor, Rows, quiet_trainer, regression_data

import fitjax as fj
from fitjax.loop import _log_fetch


def _fit(steps_per_execution: int, *, stacked: bool, monkeypatch) -> tuple[Rows, dict, int]:
    sent = []
    with monkeypatch.context() as patch:
        if stacked:  # as on an accelerator: windows copied ahead, so stacked when they come fast
            patch.setattr(_log_fetch, "copies", lambda values: True)
            stack = _log_fetch._stacked  # counts the windows each stack holds
        patch.setattr(_log_fetch, "_stacked", lambda values: (sent.append(len(set(map(id, values)))), stack(values))[1])
        rows = Rows()
        trainer = quiet_trainer(max_epochs=3, strategy="single", log_every_n_steps=2, logger=rows,
                                steps_per_execution=steps_per_execution)
        trainer.fit(Regressor(lr=0.01, batchnorm=False), fj.DataLoader(regression_data(n=512), batch_size=16),
                    fj.DataLoader(regression_data(n=64, seed=1), batch_size=32))
        return rows, dict(trainer.callback_metrics), sent


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_stacked_windows_log_the_rows_and_values_of_windows_read_one_by_one(steps_per_execution, monkeypatch):
    alone, alone_metrics, none_sent = _fit(steps_per_execution, stacked=False, monkeypatch=monkeypatch)
    stacked, stacked_metrics, sent = _fit(steps_per_execution, stacked=True, monkeypatch=monkeypatch)
    assert none_sent == []
    # 32 steps an epoch, a window every 2 (every 4 with 4 steps a call), 3 epochs: stacked
    assert len(sent) >= 3 and max(sent) >= 7 and sum(sent) >= 3 * 32 // max(2, steps_per_execution) // 2, sent
    # the rows of values, in order (the compile rows differ: the stacks' program is compiled too)
    stacked_rows, alone_rows = _values(stacked), _values(alone)
    assert [step for step, _ in stacked_rows] == [step for step, _ in alone_rows]
    for (step, row), (_, expected) in zip(stacked_rows, alone_rows):
        assert row.keys() == expected.keys(), step
        np.testing.assert_allclose([row[k] for k in sorted(row)], [expected[k] for k in sorted(row)], rtol=1e-6)
    assert np.isfinite([row["train/loss"] for _, row in stacked_rows if "train/loss" in row]).all()
    assert stacked_metrics.keys() == alone_metrics.keys()
    for key, value in alone_metrics.items():
        assert float(stacked_metrics[key]) == pytest.approx(float(value), rel=1e-6), key


def _values(rows: Rows) -> list[tuple[int, dict]]:
    kept = [(step, {k: v for k, v in row.items() if not k.startswith("compile/")}) for step, row in rows.rows]
    return [(step, row) for step, row in kept if row.keys() - {"epoch"}]


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _State:
    """The fields of a train state a window reads: the accumulators, no loss scale."""

    loss_scale = None

    def __init__(self, loss: float):
        self.metrics = {"loss": jnp.array([loss, 1.0], jnp.float32)}


def _start(fetcher, loss, step):
    state = _State(loss)
    _, window = fetcher.start(state, lambda s: s, step=step, epoch=0, batches_done=step)
    return window


def test_windows_that_come_fast_wait_on_the_device_until_due_or_read_and_slow_ones_go_alone():
    clock = _Clock()
    fetcher = _log_fetch.Fetcher(copy=True, stack=True, clock=clock)
    first = _start(fetcher, 1.0, 1)  # nothing before it: sent alone
    assert first._stack is None
    clock.now = 0.01
    held = [_start(fetcher, 2.0 + i, 2 + i) for i in range(3)]  # fast: held together
    assert all(w._stack is held[0]._stack and not w._stack.sent for w in held)
    clock.now = 0.01 + _log_fetch.HOLD_SECONDS / 2
    assert not held[0].ready()  # held, not yet due: not sent
    assert not held[0]._stack.sent
    clock.now = 0.02 + _log_fetch.HOLD_SECONDS
    jax.block_until_ready(held[-1].values)
    held[0].ready()  # due: sent now
    assert held[0]._stack.sent
    assert [float(w.read()[0]["loss"][0]) for w in [first, *held]] == [1.0, 2.0, 3.0, 4.0]
    assert held[1].read()[1] == {}  # the extra values: none here

    clock.now += 1.0
    many = [_start(fetcher, float(i), 10 + i) for i in range(_log_fetch.STACKED + 2)]
    assert many[0]._stack is None  # long after the last one: alone
    assert many[1]._stack.sent and many[1]._stack is many[-2]._stack  # a full stack goes at once
    assert not many[-1]._stack.sent  # the next one, held
    assert [float(w.read()[0]["loss"][0]) for w in many] == list(map(float, range(_log_fetch.STACKED + 2)))

    clock.now += 10 * _log_fetch.HOLD_SECONDS  # slow windows: each alone, as before
    assert _start(fetcher, 5.0, 40)._stack is None


def test_large_windows_and_several_processes_are_never_stacked():
    small = {"loss": jnp.zeros((2,), jnp.float32)}
    big = {"histogram": jnp.zeros((1 << 15,), jnp.float32)}  # 128 KiB
    on_cpu = _log_fetch.Fetcher.for_values((small, {}), ahead=4)
    assert on_cpu.windows_in_flight == 1  # on CPU: read where they are, one by one
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_log_fetch, "copies", lambda values: True)
        assert _log_fetch.Fetcher.for_values((small, {}), ahead=4).windows_in_flight == _log_fetch.STACKED
        assert _log_fetch.Fetcher.for_values((big, {}), ahead=4).windows_in_flight == 1
        patch.setattr(jax, "process_count", lambda: 2)
        assert _log_fetch.Fetcher.for_values((small, {}), ahead=4).windows_in_flight == 1


class _Computing:
    """A window's accumulator the device is still computing: records the host's waits for it."""

    nbytes = 8

    def __init__(self, waits: list, name: int):
        self.waits, self.name = waits, name

    def is_ready(self):
        return False

    def block_until_ready(self):
        self.waits.append(self.name)
        return self


def test_held_windows_keep_the_host_at_most_ahead_windows_ahead_of_the_device():
    # with windows held (not read at the bound of windows in flight), the host waits for the
    # device's oldest of the last `ahead` windows before taking another, as reading it did
    clock, waits = _Clock(), []
    fetcher = _log_fetch.Fetcher(copy=True, stack=True, ahead=3, clock=clock)
    _start(fetcher, 0.0, 0)  # alone: nothing before it
    for i in range(1, 6):
        state = _State(0.0)
        state.metrics = {"loss": _Computing(waits, i)}
        fetcher.start(state, lambda s: s, step=i, epoch=0, batches_done=i)
    assert waits == [1, 2]  # the 4th held window waited for the 1st, the 5th for the 2nd
