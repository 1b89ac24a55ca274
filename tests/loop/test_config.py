"""The loop's configuration: checked once, Lightning's rewrites applied once, frozen; the Trainer's
Lightning-named attributes read it and cannot be set."""

import dataclasses
import datetime

import pytest

import fitjax as fj
from fitjax.loop.config import LoopConfig

# Lightning 2.6's numbers for the same arguments, from
#   t = L.Trainer(logger=False, **kw)
#   (t.max_epochs, t.max_steps, t.num_sanity_val_steps, t.check_val_every_n_epoch,
#    t.limit_train_batches, t.limit_val_batches, t.limit_test_batches, t.limit_predict_batches)
# (fitjax spells "no limit" None where Lightning has -1 and 1.0; these rows have none).
LIGHTNING = [
    (dict(fast_dev_run=2, max_epochs=5, num_sanity_val_steps=3, check_val_every_n_epoch=2, limit_test_batches=7),
     (1, 2, 0, 1, 2, 2, 2, 2)),
    (dict(fast_dev_run=2, overfit_batches=3), (1, 2, 0, 1, 3, 3, 2, 2)),
    (dict(overfit_batches=3, limit_train_batches=5, limit_test_batches=4, max_epochs=2, num_sanity_val_steps=1),
     (2, None, 1, 1, 3, 3, 4, None)),
]


@pytest.mark.parametrize("arguments, expected", LIGHTNING, ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_fast_dev_run_and_overfit_batches_rewrite_as_lightning(arguments, expected):
    for config in (LoopConfig.create(**arguments), fj.Trainer(logger=False, **arguments)):
        limits = config.limits
        assert (config.max_epochs, config.max_steps, config.num_sanity_val_steps, config.check_val_every_n_epoch,
                limits["train"], limits["val"], limits["test"], limits["predict"]) == expected


def test_the_defaults_are_the_trainers_and_it_reads_every_field():
    trainer = fj.Trainer(logger=False)
    assert LoopConfig.create() == LoopConfig()
    for field in dataclasses.fields(LoopConfig):  # each a Lightning-named Trainer property
        assert getattr(trainer, field.name) == getattr(LoopConfig(), field.name), field.name
    assert LoopConfig().max_epochs == 1000  # Lightning's when nothing bounds the run
    assert LoopConfig.create(max_steps=5).max_epochs is None
    assert LoopConfig.create(max_time={"minutes": 1}).max_epochs is None  # the Timer bounds it
    assert LoopConfig.create(max_epochs=-1, max_steps=-1) == LoopConfig(max_epochs=None)


def test_durations_and_seed_are_checked_values():
    config = LoopConfig.create(val_check_interval="00:00:01:30", seed=2**40)
    assert config.val_check_interval == datetime.timedelta(minutes=1, seconds=30) and config.seed == 2**40
    with pytest.raises(ValueError, match=r"seed=\.\.\.\) must be an int from -2\*\*63"):
        LoopConfig.create(seed=2**70)


def test_nothing_changes_the_configuration_after_the_trainer_is_made():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LoopConfig.create(max_epochs=3).max_epochs = 5
    trainer = fj.Trainer(max_epochs=3, limit_val_batches=2, logger=False)
    with pytest.raises(TypeError):  # the limits are a read-only mapping
        trainer.limits["val"] = 0
    for field in dataclasses.fields(LoopConfig):
        with pytest.raises(AttributeError, match=rf"^Trainer\.{field.name} is read-only: it is a `Trainer\("):
            setattr(trainer, field.name, getattr(trainer, field.name))
    assert trainer.max_epochs == 3 and trainer.limits["val"] == 2
