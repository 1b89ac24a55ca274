import numpy as np
import pytest

from fitjax.data import DataLoader, DataModule


def arrays(n):
    return {"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3), "y": np.arange(n)}


@pytest.mark.parametrize("method", ["train", "val", "test", "predict"])
def test_dataloader_methods_must_be_overridden(method):
    with pytest.raises(NotImplementedError, match=rf"`DataModule.{method}_dataloader\(\)` is not"):
        getattr(DataModule(), f"{method}_dataloader")()


def test_default_hooks_do_nothing():
    dm = DataModule()
    dm.prepare_data()
    for stage in ("fit", "validate", "test", "predict"):
        dm.setup(stage)
        dm.teardown(stage)
    assert dm.state_dict() == {}
    dm.load_state_dict({})


def test_a_subclass_provides_its_loaders_and_state():
    class Squares(DataModule):
        def __init__(self):
            self.calls = []
            self.version = 0

        def prepare_data(self):
            self.calls.append("prepare_data")

        def setup(self, stage):
            self.calls.append(f"setup:{stage}")
            self.train = arrays(10)

        def train_dataloader(self):
            return DataLoader(self.train, batch_size=4, shuffle=True)

        def state_dict(self):
            return {"version": self.version}

        def load_state_dict(self, state):
            self.version = state["version"]

    dm = Squares()
    dm.prepare_data()
    dm.setup("fit")
    assert dm.calls == ["prepare_data", "setup:fit"]
    assert sorted(np.concatenate([b["y"] for b in dm.train_dataloader()])) == list(range(10))
    dm.load_state_dict({"version": 3})
    assert dm.state_dict() == {"version": 3}
    with pytest.raises(NotImplementedError, match="val_dataloader"):
        dm.val_dataloader()


def test_from_datasets_builds_fitjax_loaders():
    dm = DataModule.from_datasets(arrays(50), arrays(20), predict=arrays(7), batch_size=8, seed=4)
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert dm.train_dataloader() is train  # one loader per split, so its position is checkpointed
    assert isinstance(train, DataLoader) and train.shuffle and train.seed == 4
    assert not val.shuffle and len(val) == 3 and len(dm.predict_dataloader()) == 1
    rows = np.concatenate([b["y"] for b in train])
    assert sorted(rows) == list(range(50)) and not np.array_equal(rows, np.arange(50))
    np.testing.assert_array_equal(np.concatenate([b["y"] for b in val]), np.arange(20))
    with pytest.raises(NotImplementedError, match=r"no test data.*without `test=`"):
        dm.test_dataloader()


def test_from_datasets_options_and_errors():
    dm = DataModule.from_datasets(arrays(10), batch_size=4, shuffle_train=False)
    rows = np.concatenate([b["y"] for b in dm.train_dataloader()])
    np.testing.assert_array_equal(rows, np.arange(10))
    with pytest.raises(ValueError, match=r"received no data: pass at least one of train"):
        DataModule.from_datasets(batch_size=4)
    with pytest.raises(ValueError, match=r"from_datasets\(val=...\)`: .*is empty"):
        DataModule.from_datasets(arrays(10), arrays(0), batch_size=4)
    with pytest.raises(TypeError, match=r"from_datasets\(train=...\)`: .*batch_size"):
        DataModule.from_datasets(arrays(10), batch_size=None)
