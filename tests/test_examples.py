"""The examples are programs users copy: each one runs here, end to end, to its stated bar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import helpers  # noqa: F401  (first: it puts examples/ on the path)
import fitjax as fj
import digits


def test_digits_example_data_parallel_reaches_95_percent(tmp_path):
    results = digits.main(["--strategy", "dp", "--epochs", "6", "--no-progress-bar", "--root-dir", str(tmp_path)])
    assert results["val/acc"] >= 0.95
    assert list(Path(tmp_path, "fitjax_logs", "version_0").glob("events.out.tfevents.*"))


def test_imbalanced_digits_example_logs_macro_f1_and_auroc_and_keeps_the_best_f1(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import imbalanced_digits

    results = imbalanced_digits.main(["--epochs", "3", "--no-progress-bar", "--root-dir", str(tmp_path)])
    found = results["metrics"]
    assert 0.9 <= found["val/auroc"] <= 1.0
    assert found["val/f1"] < found["val/acc"]  # the rare classes pull the macro F1 down
    events = EventAccumulator(str(results["log_dir"]), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    by_epoch = [e.value for e in events.Scalars("val/f1")]
    best = int(np.argmax(by_epoch))
    assert results["best_f1"] == pytest.approx(by_epoch[best])
    assert Path(results["best_model_path"]).name.startswith(f"epoch={best}-")
    assert "val/confusion" in events.Tags()["images"]


def test_the_digits_example_promises_the_figure_readme_and_the_docs_promise():
    """A newcomer reads the figure in three places; they must not disagree (they did: ~98% in the
    example, 99.4% in README)."""
    import re

    root = Path(__file__).resolve().parents[1]

    def figures(text: str) -> set[str]:
        return set(re.findall(r"(\d+\.\d)% val", text))

    example = figures(Path(digits.__file__).read_text())
    assert example, "examples/digits.py states no validation accuracy"
    for page in ("README.md", "docs/index.md"):
        line = next(l for l in (root / page).read_text().splitlines() if "python examples/digits.py" in l)
        assert figures(line) == example, f"{page} promises {figures(line)}, examples/digits.py {example}"


def test_flax_mnist_port_trains_the_original_network_to_its_stated_accuracy(tmp_path):
    """Flax's NNX MNIST example as ported (docs/porting.md, *Worked examples*), its hyperparameters
    unchanged: it reaches the figure its docstring states (~93% on the digits)."""
    import flax_mnist

    results = flax_mnist.main(["--no-progress-bar", "--root-dir", str(tmp_path)])
    assert results["val/accuracy"] >= 0.9
    assert results["train/loss_epoch"] < 0.5


def test_flax_sst2_port_compiles_each_step_once_per_bucket_width():
    """Flax's SST-2 example as ported: batches bucketed into three widths, and the CPU step (its
    scratch plan included) compiles once per width for training and once for evaluation."""
    import flax_sst2

    from helpers import count_compiles

    train = flax_sst2.BucketedBatches(flax_sst2.sentences(640, seed=0), shuffle=True, seed=0, drop_last=True)
    val = flax_sst2.BucketedBatches(flax_sst2.sentences(320, seed=1))
    widths = {batch["tokens"].shape[1] for batch in train}
    assert widths == {8, 16, 24}
    trainer = fj.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, seed=0)
    with count_compiles() as compiles:
        trainer.fit(flax_sst2.SST2Classifier(), train, val)
    assert compiles["train_step"] == len(widths)
    assert compiles["eval_step"] == len(widths)
    assert trainer.global_step == len(train)
    assert np.isfinite(float(trainer.callback_metrics["val/loss"]))


def test_sft_example_tunes_packed_masked_chats_with_lora_and_exports_a_folder_transformers_reads(tmp_path):
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import sft

    result = sft.main(["--out", str(tmp_path), "--base-steps", "12", "--steps", "12", "--seq-len", "64"])
    assert result["val_loss_after"] < result["val_loss_before"]  # the answers, learned by the adapters
    assert result["packing_efficiency"] > 0.8
    tags = set()  # one event file per fit
    for events in Path(result["log_dir"]).glob("events.out.tfevents.*"):
        tags |= set(EventAccumulator(str(events), size_guidance={"tensors": 0}).Reload().Tags()["tensors"])
    assert "samples/text_summary" in tags  # the samples, in TensorBoard's Text tab

    model, info = AutoModelForCausalLM.from_pretrained(result["model"], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = AutoTokenizer.from_pretrained(result["model"])
    prompt = tokenizer.apply_chat_template([{"role": "system", "content": sft.SYSTEM},
                                            {"role": "user", "content": "reverse : big red dog ran"}],
                                           tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(prompt)])
    out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    # the exported weights continue the prompt as fitjax's did at the last validation (greedy)
    assert tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == result["samples"][0]
