"""FSDP's `tensor` axis: the mesh it builds, and the errors for sizes and rules that cannot work.

Training through it (parity with one device, resume) is tested on a transformer in tests/test_gpt.py.
"""

from __future__ import annotations

import pytest
from helpers import quiet_trainer
from jax.sharding import PartitionSpec as P

from fitjax.strategies import FSDP, _rules


@pytest.mark.parametrize("kwargs, shape", [
    ({"tensor": 2}, {"data": 1, "fsdp": 4, "tensor": 2}),
    ({"data": 2, "tensor": 2}, {"data": 2, "fsdp": 2, "tensor": 2}),
    ({"fsdp": 1, "tensor": 8}, {"data": 1, "fsdp": 1, "tensor": 8}),
])
def test_tensor_axis_takes_its_devices_before_data_and_fsdp(kwargs, shape):
    trainer = quiet_trainer(strategy=FSDP(**kwargs), devices=8)
    assert dict(trainer.strategy.mesh.shape) == shape
    assert trainer.strategy.num_batch_shards == shape["data"] * shape["fsdp"]  # tensor devices share rows


@pytest.mark.parametrize("kwargs, message", [
    ({"tensor": 3}, r"FSDP\(tensor=3\) does not divide the 8 selected devices"),
    ({"fsdp": 3, "tensor": 2}, r"FSDP\(fsdp=3\) does not divide the 4 devices left by tensor=2"),
    ({"data": 2, "fsdp": 2, "tensor": 4}, r"data=2, fsdp=2, tensor=4\) needs data × fsdp × tensor = 16"),
    ({"tensor": 0}, r"FSDP\(tensor=...\) must be a positive int"),
    ({"tensor": None}, r"got None"),
])
def test_bad_tensor_sizes_name_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        quiet_trainer(strategy=FSDP(**kwargs), devices=8)


def test_rules_map_logical_names_to_the_tensor_axis_and_reject_an_axis_used_twice():
    strategy = FSDP(tensor=2)
    quiet_trainer(strategy=strategy, devices=8)
    rules = {"embed": "fsdp", "heads": "tensor", "mlp": "tensor", "kv": None}
    spec = _rules.annotated_spec(("embed", "heads", "kv"), (32, 4, 8), strategy.mesh, rules, "q/kernel")
    assert spec == P("fsdp", "tensor", None)
    with pytest.raises(ValueError, match=r"w's annotation \('mlp', 'heads'\) puts mesh axis 'tensor' on two"):
        _rules.annotated_spec(("mlp", "heads"), (32, 4), strategy.mesh, rules, "w")
    with pytest.raises(ValueError, match=r"size 3 annotated 'heads' -> mesh axes \('tensor',\) of 2 devices"):
        _rules.annotated_spec(("embed", "heads", "kv"), (32, 3, 8), strategy.mesh, rules, "q/kernel")

    plain = FSDP()  # tensor=1: a second use of the size-1 axis splits nothing and is dropped
    quiet_trainer(strategy=plain, devices=8)
    assert _rules.annotated_spec(("mlp", "heads"), (32, 4), plain.mesh, rules, "w") == P("tensor", None)


def test_rules_from_yaml_lists_become_tuples_of_mesh_axes():
    assert FSDP(rules={"batch": ["data", "fsdp"], "mlp": "tensor"}).rules == {"batch": ("data", "fsdp"), "mlp": "tensor"}
