"""`DataModule`: the data of a project in one object, like Lightning's `LightningDataModule`."""

from __future__ import annotations

from typing import Any

from fitjax.data._loader import DataLoader


class DataModule:
    """Groups the preparation, splits and loaders of a project's data.

    Subclass it and override what the project needs; the trainer calls the hooks:
    `prepare_data()` once, on the first process only (downloads, writing to disk — no state
    on `self`, other processes do not run it); `setup(stage)` on every process before a
    stage, with `stage` one of "fit", "validate", "test" or "predict" (build splits, assign
    them to `self`); the `*_dataloader()` method of the stage; `teardown(stage)` after it.
    A `*_dataloader()` method that is not overridden raises `NotImplementedError`, which is how
    the trainer learns that a split is absent (no validation, say).

    Loaders may be anything `fj.as_loader` accepts. Return the same loader object on every
    call when its position must be checkpointed (the trainer saves that object's state).

    Example:
      >>> import numpy as np
      >>> class Digits(DataModule):
      ...     def setup(self, stage):
      ...         x = np.random.default_rng(0).normal(size=(100, 8)).astype(np.float32)
      ...         self.train = {"x": x[:80], "y": np.zeros(80, np.int32)}
      ...     def train_dataloader(self):
      ...         return DataLoader(self.train, batch_size=16, shuffle=True)
      >>> dm = Digits()
      >>> dm.setup("fit")
      >>> len(dm.train_dataloader())
      5
    """

    def prepare_data(self) -> None:
        """Downloads or writes data once, on the first process; keeps no state on `self`."""

    def setup(self, stage: str) -> None:
        """Builds what `stage` ("fit", "validate", "test" or "predict") needs, on every process."""

    def teardown(self, stage: str) -> None:
        """Releases what `setup(stage)` built, after the stage."""

    def train_dataloader(self) -> Any:
        """Returns the training data (anything `as_loader` accepts)."""
        raise _not_overridden("train_dataloader", "fit")

    def val_dataloader(self) -> Any:
        """Returns the validation data (anything `as_loader` accepts)."""
        raise _not_overridden("val_dataloader", "fit or validate")

    def test_dataloader(self) -> Any:
        """Returns the test data (anything `as_loader` accepts)."""
        raise _not_overridden("test_dataloader", "test")

    def predict_dataloader(self) -> Any:
        """Returns the data to predict on (anything `as_loader` accepts)."""
        raise _not_overridden("predict_dataloader", "predict")

    def state_dict(self) -> dict[str, Any]:
        """State to store in checkpoints; empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what `state_dict()` returned; nothing by default."""

    @classmethod
    def from_datasets(
        cls,
        train: Any = None,
        val: Any = None,
        test: Any = None,
        predict: Any = None,
        *,
        batch_size: int,
        shuffle_train: bool = True,
        seed: int = 0,
    ) -> DataModule:
        """Builds a DataModule whose loaders are `fj.DataLoader`s over in-memory arrays.

        Args:
          train: the training arrays (an array or a pytree of arrays), or None.
          val: the validation arrays, or None.
          test: the test arrays, or None.
          predict: the arrays to predict on, or None.
          batch_size: examples per batch, for every split.
          shuffle_train: whether the training loader shuffles (the others never do).
          seed: the training shuffle's seed.

        Returns:
          A DataModule whose `*_dataloader()` methods return the same loader on every call and
          raise `NotImplementedError` for splits given as None.

        Example:
          >>> import numpy as np
          >>> x, y = np.zeros((100, 8)), np.zeros(100)
          >>> dm = DataModule.from_datasets({"x": x, "y": y}, {"x": x[:20], "y": y[:20]},
          ...                               batch_size=32)
          >>> len(dm.train_dataloader()), len(dm.val_dataloader())
          (4, 1)
        """
        splits = {"train": train, "val": val, "test": test, "predict": predict}
        if all(data is None for data in splits.values()):
            raise ValueError(
                "`DataModule.from_datasets(...)` received no data: pass at least one of train, "
                "val, test or predict."
            )
        loaders = {}
        for split, data in splits.items():
            if data is None:
                continue
            shuffle = shuffle_train and split == "train"
            try:
                loaders[split] = DataLoader(data, batch_size=batch_size, shuffle=shuffle, seed=seed)
            except (TypeError, ValueError) as error:
                raise type(error)(f"`DataModule.from_datasets({split}=...)`: {error}") from error
        return _ArraysDataModule(loaders)


class _ArraysDataModule(DataModule):
    """What `DataModule.from_datasets` returns: a fixed loader per split, made once."""

    def __init__(self, loaders: dict[str, DataLoader]) -> None:
        self._loaders = loaders

    def _loader(self, split: str) -> DataLoader:
        if split not in self._loaders:
            raise NotImplementedError(
                f"This DataModule has no {split} data: it was built by "
                f"`DataModule.from_datasets(...)` without `{split}=`; pass {split} arrays there."
            )
        return self._loaders[split]

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")


def _not_overridden(method: str, stage: str) -> NotImplementedError:
    return NotImplementedError(
        f"`DataModule.{method}()` is not overridden, so this DataModule has no data for "
        f"{stage}; define `def {method}(self): return fj.DataLoader(...)` in your subclass."
    )
