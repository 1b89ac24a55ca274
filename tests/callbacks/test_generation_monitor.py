"""`GenerationMonitor`: continuations of fixed prompts every n steps, in TensorBoard's Text tab,
read back with the tensorboard package's own reader."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import VOCAB, TinyLMModule
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import fitjax as fj

PROMPTS = [[3, 7, 1], [5, 2, 9, 9, 4]]


def test_samples_every_n_steps_reach_the_text_tab(tmp_path):
    monitor = fj.GenerationMonitor(PROMPTS, every_n_train_steps=2, max_new_tokens=6, temperature=0.8, seed=10)
    trainer = fj.Trainer(max_steps=5, strategy="dp", log_every_n_steps=5, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, logger=fj.TensorBoardLogger(tmp_path), callbacks=[monitor])
    module = TinyLMModule()
    data = np.random.default_rng(0).integers(0, VOCAB, (64, 9)).astype(np.int32)
    trainer.fit(module, fj.DataLoader(data, batch_size=8))
    assert [step for step, _ in monitor.history] == [2, 4, 5]  # every 2 steps, and when training ends
    # the last: what the fitted weights generate with the seed of step 5
    assert monitor.history[-1][1] == trainer.generate(module, PROMPTS, max_new_tokens=6, temperature=0.8, seed=15)

    events = EventAccumulator(trainer.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    tables = events.Tensors("samples/text_summary")
    assert [t.step for t in tables] == [2, 4, 5]
    for table, (_, continuations) in zip(tables, monitor.history):
        rows = table.tensor_proto.string_val[0].decode().splitlines()
        assert rows[:2] == ["| prompt | continuation |", "|---|---|"]
        assert rows[2:] == [f"| {' '.join(map(str, p))} | {' '.join(map(str, c))} |"
                            for p, c in zip(PROMPTS, continuations)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts="one string"), r"prompts=\.\.\.\) must be a non-empty list"),
    (dict(prompts=[], every_n_train_steps=5), r"prompts=\.\.\.\) must be a non-empty list"),
    (dict(prompts=["a"], every_n_train_steps=-1), r"every_n_train_steps=\.\.\.\) must be an int >= 0"),
])
def test_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fj.GenerationMonitor(**kwargs)


def test_generation_options_are_checked_when_the_monitor_is_made():
    """The options are `fj.GenerationOptions`', checked at construction, not at the first sample
    hundreds of steps in."""
    assert fj.GenerationMonitor(PROMPTS, top_k=5).options == fj.GenerationOptions(temperature=0.8, top_k=5)
    with pytest.raises(ValueError, match=r"GenerationMonitor\(top_p=\.\.\.\) must be None or a number in \(0, 1\]"):
        fj.GenerationMonitor(PROMPTS, top_p=2)
    with pytest.raises(TypeError, match=r"GenerationMonitor\(top_n=\.\.\.\) is not an option; .* max_new_tokens, "):
        fj.GenerationMonitor(PROMPTS, top_n=5)
