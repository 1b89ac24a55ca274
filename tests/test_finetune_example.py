"""examples/finetune_lora.py: a GPT saved by fitjax is adapted with LoRA on new text, the loss on
that text goes down, and the adapter file is a small part of the full model's."""

from __future__ import annotations

import numpy as np
from helpers import quiet_trainer  # first: it puts examples/ on the path

import finetune_lora  # noqa: E402,I001
import gpt  # noqa: E402

import fitjax as fj


def test_lora_from_a_saved_gpt_checkpoint_lowers_the_loss_and_keeps_a_small_adapter_file(tmp_path):
    base = gpt.GPTModule(layers=1, width=64, heads=2, context=32)
    trainer = quiet_trainer(max_steps=2, strategy="single", enable_checkpointing=True, default_root_dir=tmp_path,
                            callbacks=[fj.ModelCheckpoint(dirpath=tmp_path / "ckpt")])
    train, _ = gpt.splits(32)
    trainer.fit(base, fj.DataLoader({"tokens": train["tokens"][:64]}, batch_size=16))

    (saved,) = (tmp_path / "ckpt").iterdir()
    result = finetune_lora.main(["--base", str(saved), "--steps", "12", "--rank", "2",
                                 "--lr", "1e-2", "--strategy", "single", "--root-dir", str(tmp_path / "lora")])
    assert result.val_loss_after < result.val_loss_before - 0.05
    assert result.adapter_bytes < 0.1 * result.full_bytes
    assert result.checkpoint_bytes < 0.5 * result.full_checkpoint_bytes  # Orbax's own files weigh here
    params = result.module.variables[0]
    np.testing.assert_array_equal(np.asarray(params["h_0"]["mlp"]["c_fc"]["kernel"]),
                                  np.asarray(base.variables[0]["h_0"]["mlp"]["c_fc"]["kernel"]))
