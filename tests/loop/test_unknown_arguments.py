"""A mistyped Trainer argument gets "did you mean" and the valid names, as a TypeError."""

from __future__ import annotations

import pytest

import fitjax as fj


@pytest.mark.parametrize("given, meant", [({"max_epoch": 3}, "max_epochs"), ({"epochs": 3}, "max_epochs"),
                                          ({"gpus": 1}, "devices (with accelerator='gpu')"),
                                          ({"log_every_n_step": 5}, "log_every_n_steps")])
def test_a_mistyped_trainer_argument_says_what_was_meant(given, meant):
    with pytest.raises(TypeError, match=r"Trainer\(\) got unknown argument") as raised:
        fj.Trainer(**given)
    name = next(iter(given))
    assert f"{name}= (did you mean {meant}?)" in str(raised.value)
    assert "takes max_epochs, max_steps" in str(raised.value)  # the valid names


def test_a_subclass_with_its_own_arguments_is_checked_against_them():
    class Mine(fj.Trainer):
        def __init__(self, *, patience: int = 3, **kwargs):
            super().__init__(**kwargs)
            self.patience = patience

    assert Mine(patience=5, max_epochs=1).patience == 5  # **kwargs: anything goes to its __init__
    with pytest.raises(TypeError, match="max_epoch"):
        Mine(max_epoch=1)  # Trainer's own check in super().__init__: Python's error
