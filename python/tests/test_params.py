"""MLP.save / MLP.load: safetensors that numpy reads as PyTorch's names and shapes, and
that load back bit for bit; a checkpoint of other sizes is refused."""

import json
import struct

import numpy as np
import pytest

import tapejit


def read_safetensors(path):
    """The safetensors format with nothing but numpy: an 8-byte header length, a JSON
    header of dtypes, shapes and offsets, then the tensors' bytes."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        assert t["dtype"] == "F64"
        start, end = t["data_offsets"]
        tensors[name] = np.frombuffer(data[start:end], dtype="<f8").reshape(t["shape"])
    return tensors, metadata


def test_save_writes_pytorch_names_and_load_reads_them_back(tmp_path):
    model = tapejit.nn.MLP(3, [4, 2])
    path = tmp_path / "mlp.safetensors"
    model.save(path)
    tensors, metadata = read_safetensors(path)
    assert metadata["architecture"] == "3-4-2"
    assert {k: v.shape for k, v in tensors.items()} == {
        "layers.0.weight": (4, 3), "layers.0.bias": (4,),
        "layers.1.weight": (2, 4), "layers.1.bias": (2,),
    }
    first = model.layers[0].neurons[1]
    assert list(tensors["layers.0.weight"][1]) == [w.data for w in first.w]
    assert tensors["layers.0.bias"][1] == first.b.data

    other = tapejit.nn.MLP(3, [4, 2])
    other.load(path)
    assert [p.data for p in other.parameters()] == [p.data for p in model.parameters()]

    with pytest.raises(ValueError, match="3-4-2"):
        tapejit.nn.MLP(3, [5, 2]).load(path)
    with pytest.raises(ValueError, match="cannot read"):
        model.load(tmp_path / "missing.safetensors")


def test_load_refuses_a_checkpoint_of_the_right_sizes_holding_fewer_params(tmp_path):
    """A file that says 2-3-1 but holds 5 of its 13 params is refused, not half loaded."""
    path = str(tmp_path / "short.safetensors")
    tapejit.nn.save_params(path, [2, 3, 1], [0.5] * 5)
    model = tapejit.nn.MLP(2, [3, 1])
    before = [p.data for p in model.parameters()]
    with pytest.raises(ValueError, match="holds 5 params, but this model has 13"):
        model.load(path)
    assert [p.data for p in model.parameters()] == before
