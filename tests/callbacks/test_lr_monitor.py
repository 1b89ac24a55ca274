"""LearningRateMonitor logs the learning rate each logged step actually applied."""

from __future__ import annotations

import jax
import optax
import pytest
from helpers import Regressor, quiet_trainer, regression_data

import fitjax as fj

SCHEDULE = optax.warmup_cosine_decay_schedule(0.0, 0.1, 4, 16)


class Scheduled(Regressor):
    def __init__(self, how: str, schedule=SCHEDULE):
        super().__init__()
        self.how, self.schedule = how, schedule
        if how == "attribute":
            self.lr_schedule = schedule

    def configure_optimizer(self):
        if self.how == "inject":
            return optax.inject_hyperparams(optax.adam)(learning_rate=SCHEDULE)
        if self.how == "groups":  # Dense layers at the schedule, BatchNorm at a constant
            labels = lambda params: {k: "dense" if k.startswith("Dense") else "norm" for k in params}  # noqa: E731
            return optax.multi_transform(
                {"dense": optax.inject_hyperparams(optax.sgd)(learning_rate=SCHEDULE),
                 "norm": optax.inject_hyperparams(optax.sgd)(learning_rate=0.01)},
                labels,
            )
        return optax.adam(self.schedule)


def _fit(how, callbacks=(), log_every_n_steps=3, schedule=SCHEDULE, **kwargs):
    monitor = fj.LearningRateMonitor(**kwargs)
    trainer = quiet_trainer(max_epochs=2, strategy="single", log_every_n_steps=log_every_n_steps,
                            callbacks=[*callbacks, monitor, *callbacks])
    trainer.fit(Scheduled(how, schedule), fj.DataLoader(regression_data(n=128), batch_size=16))  # 8 steps/epoch
    return monitor


@pytest.mark.parametrize("how", ["inject", "attribute"])
def test_logged_values_equal_the_schedule_at_the_applied_steps(how):
    monitor = _fit(how)
    # the update that made global step s ran with optimizer count s - 1
    expected = [(s, pytest.approx(float(SCHEDULE(s - 1)), rel=1e-6, abs=1e-9)) for s in range(3, 17, 3)]
    assert monitor.history == {"lr": expected}


def test_a_schedule_attribute_logs_the_rate_the_step_applied_bit_for_bit():
    # the injected rate is the one the jitted update evaluated and stored; the attribute's is
    # evaluated by the monitor (eagerly, op by op, it differed in the last bits)
    assert _fit("attribute").history == _fit("inject").history


class _Compiles(fj.Callback):
    """Placed before and after the monitor: the compilations each step's monitor read caused."""

    def __init__(self):
        self.events, self.per_step, self._before = [], [], None
        jax.monitoring.register_event_duration_secs_listener(self._heard)

    def _heard(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.events.append(event)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self._before is None:
            self._before = len(self.events)
        else:
            self.per_step.append(len(self.events) - self._before)
            self._before = None


def test_reading_a_schedule_attribute_compiles_one_program_once():
    compiles = _Compiles()
    try:
        # a schedule of its own: `jax.jit` of a function it jitted before compiles nothing
        fresh = optax.warmup_cosine_decay_schedule(0.0, 0.1, 4, 16)
        _fit("attribute", callbacks=[compiles], log_every_n_steps=1, schedule=fresh)
    finally:
        jax.monitoring.unregister_event_duration_listener(compiles._heard)
    # the schedule jitted once on the host (eagerly, its ~12 operations compiled one by one; none
    # where an earlier test of this process compiled them, or the compile cache holds it)
    assert compiles.per_step[0] <= 1 and compiles.per_step[1:] == [0] * 15


class PythonSchedule(Regressor):
    """A schedule that branches on its count in Python: it cannot be jitted, only called."""

    lr_schedule = staticmethod(lambda count: 0.1 if count < 4 else 0.01)

    def configure_optimizer(self):
        return optax.sgd(0.1)  # the monitor reads `lr_schedule` (the optimizer cannot be built from it)


def test_a_schedule_that_cannot_be_traced_is_called_as_it_is():
    monitor = fj.LearningRateMonitor()
    trainer = quiet_trainer(max_epochs=1, strategy="single", log_every_n_steps=3, callbacks=[monitor])
    trainer.fit(PythonSchedule(), fj.DataLoader(regression_data(n=128), batch_size=16))
    assert monitor.history == {"lr": [(3, 0.1), (6, 0.01)]}


def test_param_groups_get_one_key_each_and_epoch_interval_logs_at_epoch_ends():
    monitor = _fit("groups", logging_interval="epoch")
    assert monitor.history == {
        "lr/dense": [(8, pytest.approx(float(SCHEDULE(7)))), (16, pytest.approx(float(SCHEDULE(15))))],
        "lr/norm": [(8, pytest.approx(0.01)), (16, pytest.approx(0.01))],
    }


def test_an_optimizer_that_hides_its_schedule_gets_an_error_saying_how_to_expose_it():
    with pytest.raises(ValueError, match=r"inject_hyperparams.*lr_schedule"):
        _fit("hidden")
    with pytest.raises(ValueError, match=r"logging_interval=.*'batch'"):
        fj.LearningRateMonitor("batch")
