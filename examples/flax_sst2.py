"""Flax's SST-2 example (`examples/sst2`: a Linen BiLSTM sentiment classifier),
ported to fitjax.

The model is the original's shape: an embedding with word dropout and dropout,
a bidirectional LSTM over the padded tokens, keys-only MLP attention pooling
and a one-hidden-layer MLP giving one logit; SGD (rate 0.1, momentum 0.9) with
weight decay 3e-6; batches of 64 bucketed by length into widths that are
multiples of 8, so the step sees a few shapes. What changed:

- The original's `train_step`/`eval_step`, its epoch loop, metric sums and
  TensorBoard writes become `loss`, `metrics` and one `Trainer.fit`; its
  dropout keys (`make_rng("dropout")`) come from the trainer, folded with the
  step.
- Its hand-written `flip_sequences` and two scanned LSTMs become flax's
  `nn.Bidirectional` of two `nn.RNN`s, which take the sequence lengths
  themselves.
- The bucketing input pipeline (tf.data's `bucket_by_sequence_length`) is
  `BucketedBatches`, a plain re-iterable of numpy batches: fitjax takes any
  re-iterable, and compiles the step once per width (three here).
- Data: GLUE's SST-2 needs a download, so sentences are generated: random
  words of which some carry a polarity; the label is the sign of their sum,
  and "not" flips the next word's.

    python examples/flax_sst2.py    # 6 epochs: ~99% validation accuracy
                                    # (99.4% measured)
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import fitjax as fj

VOCAB, UNK, NOT = 256, 1, 2  # id 0 pads
POLARITY = np.zeros(VOCAB, np.int32)
POLARITY[3:23], POLARITY[23:43] = 1, -1  # 20 positive and 20 negative words


class WordDropout(nn.Module):
    """Replaces each token id by `UNK` with probability `rate` while training."""

    rate: float

    @nn.compact
    def __call__(self, tokens, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return tokens
        dropped = jax.random.bernoulli(self.make_rng("dropout"), self.rate, tokens.shape)
        return jnp.where(dropped, UNK, tokens)


class TextClassifier(nn.Module):
    """Embedding -> BiLSTM -> keys-only attention -> MLP -> one logit."""

    embedding_size: int = 64
    hidden_size: int = 64
    dropout_rate: float = 0.5
    word_dropout_rate: float = 0.1

    @nn.compact
    def __call__(self, tokens, lengths, train: bool):
        tokens = WordDropout(self.word_dropout_rate)(tokens, deterministic=not train)
        embedded = nn.Embed(VOCAB, self.embedding_size, embedding_init=nn.initializers.normal(0.1))(tokens)
        embedded = nn.Dropout(self.dropout_rate, deterministic=not train)(embedded)
        keys = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(self.hidden_size)),
                                nn.RNN(nn.OptimizedLSTMCell(self.hidden_size)))(embedded, seq_lengths=lengths)
        scores = nn.Dense(1)(nn.tanh(nn.Dense(self.hidden_size)(keys)))[..., 0]  # keys-only attention
        valid = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
        weights = jax.nn.softmax(jnp.where(valid, scores, -1e9), axis=-1)
        pooled = jnp.einsum("bt,btd->bd", weights, keys)
        hidden = nn.Dropout(self.dropout_rate, deterministic=not train)(nn.tanh(nn.Dense(self.hidden_size)(pooled)))
        return nn.Dense(1, use_bias=False)(hidden)[:, 0]


class SST2Classifier(fj.LitModule):
    def __init__(self, learning_rate: float = 0.1, momentum: float = 0.9, weight_decay: float = 3e-6):
        super().__init__()
        self.save_hyperparameters()
        self.model = TextClassifier()

    def loss(self, model, batch):
        logits = model(batch["tokens"], batch["length"], train=self.training)
        loss = optax.sigmoid_binary_cross_entropy(logits, batch["label"].astype(jnp.float32)).mean()
        return loss, {"logits": logits}

    def metrics(self, batch, outputs):
        return {"acc": ((outputs["logits"] > 0) == (batch["label"] == 1)).mean()}

    def configure_optimizer(self):
        hp = self.hparams
        return optax.chain(optax.add_decayed_weights(hp.weight_decay), optax.sgd(hp.learning_rate, hp.momentum))


def sentences(n: int, seed: int, max_length: int = 24) -> list[np.ndarray]:
    """`n` (tokens, label) pairs: a label is 1 when the words' polarities sum above 0 ("not"
    flips the next word's); sentences whose sum is 0 are drawn again."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        tokens = rng.integers(NOT, VOCAB, rng.integers(4, max_length + 1))
        signs = np.where(np.roll(tokens == NOT, 1) & (np.arange(len(tokens)) > 0), -1, 1)
        total = int((POLARITY[tokens] * signs).sum())
        if total != 0:
            out.append((tokens.astype(np.int32), int(total > 0)))
    return out


class BucketedBatches:
    """Batches of `batch_size` sentences of similar length, padded to the next multiple of
    `bucket_size`; shuffled within buckets and in batch order each epoch when `shuffle`. With
    `drop_last`, each bucket's last partial batch is left out (one shape per width to compile)."""

    def __init__(self, examples, batch_size: int = 64, bucket_size: int = 8, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False):
        self.examples, self.batch_size, self.bucket_size = examples, batch_size, bucket_size
        self.shuffle, self.seed, self.epoch, self.drop_last = shuffle, seed, 0, drop_last
        by_width: dict[int, list[int]] = {}
        for i, (tokens, _) in enumerate(examples):
            by_width.setdefault(-(-len(tokens) // bucket_size) * bucket_size, []).append(i)
        self.buckets = by_width

    def _batches(self, rng) -> list[tuple[int, list[int]]]:
        batches = []
        for width, members in sorted(self.buckets.items()):
            members = list(rng.permutation(members)) if rng is not None else members
            batches += [(width, members[i:i + self.batch_size]) for i in range(0, len(members), self.batch_size)
                        if not self.drop_last or i + self.batch_size <= len(members)]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __len__(self) -> int:
        return len(self._batches(None))

    def __iter__(self):
        rng = np.random.default_rng((self.seed, self.epoch)) if self.shuffle else None
        self.epoch += 1
        for width, members in self._batches(rng):
            tokens = np.zeros((len(members), width), np.int32)
            for row, i in enumerate(members):
                tokens[row, :len(self.examples[i][0])] = self.examples[i][0]
            yield {"tokens": tokens,
                   "length": np.array([len(self.examples[i][0]) for i in members], np.int32),
                   "label": np.array([self.examples[i][1] for i in members], np.int32)}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-epochs", type=int, default=6)
    parser.add_argument("--train-size", type=int, default=4000, help="generated training sentences")
    parser.add_argument("--root-dir", default=".", help="where fitjax_logs/ and checkpoints go")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    train = BucketedBatches(sentences(args.train_size, seed=0), shuffle=True, seed=0, drop_last=True)
    val = BucketedBatches(sentences(1000, seed=1))
    trainer = fj.Trainer(max_epochs=args.num_epochs, default_root_dir=args.root_dir,
                         enable_progress_bar=not args.no_progress_bar, seed=0)
    trainer.fit(SST2Classifier(), train, val)
    results = {name: float(value) for name, value in trainer.callback_metrics.items()}
    print(f"val_loss {results['val/loss']:.4f}, val_acc {100 * results['val/acc']:.2f}")
    return results


if __name__ == "__main__":
    main()
