"""graph/kv_shapes.py: a length read from a past value state is read from the key state instead.

Each test builds a small stateful OpenVINO graph by hand: a past key and value state (read through a
beam_idx Gather, as optimum-intel writes them), each concatenated with the new token's key or value,
and an output that broadcasts the keys to a shape read from the past value state, the shape-read form
the Qwen3.5 graph has (tests/test_architectures.py runs the real one through GenAI's NPU pipeline).
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from openvino import opset13 as ops
from openvino.op.util import Variable, VariableInfo

from optimum_shared_graph.graph.kv_shapes import read_lengths_from_keys

HEADS, HEAD_DIM = 2, 4


def _graph(value_dims=(2,), key_shape=(-1, HEADS, -1, HEAD_DIM)):
    """A graph whose output is read at `shape(past_value)[value_dims]`: for the length (`(2,)`), the new keys
    broadcast to `[1, heads, length + 1, head_dim]`, as `repeat_kv` does; otherwise those dimensions."""
    new = ops.parameter([-1, HEADS, 1, HEAD_DIM], np.float32, name="new")
    beam_idx = ops.parameter([-1], np.int32, name="beam_idx")
    states, sinks = {}, []
    for kind, shape in (("key", key_shape), ("value", (-1, HEADS, -1, HEAD_DIM))):
        info = VariableInfo()
        info.data_shape = ov.PartialShape(list(shape))
        info.data_type = ov.Type.f32
        info.variable_id = f"past_key_values.0.{kind}present.0.{kind}"
        variable = Variable(info)
        empty = [1, HEADS, 0, HEAD_DIM] if shape[2] == -1 else [1, HEADS, HEAD_DIM, 0]
        read = ops.read_value(ops.constant(np.zeros(empty, np.float32)), variable)
        past = ops.gather(read, beam_idx, ops.constant(np.int64(0)))
        present = ops.concat([past, new], 2) if shape[2] == -1 else ops.concat([past, ops.transpose(new, [0, 1, 3, 2])], 3)
        sinks.append(ops.assign(present, variable))
        states[kind] = present
    read = ops.gather(ops.shape_of(states["value"].input_value(0)), ops.constant(np.array(value_dims, np.int64)),
                      ops.constant(np.int64(0)))
    if value_dims == (2,):
        target = ops.concat([ops.constant(np.array([1, HEADS], np.int64)), ops.add(read, ops.constant(np.int64(1))),
                             ops.constant(np.array([HEAD_DIM], np.int64))], 0)
        out = ops.broadcast(states["key"], target)
    else:
        out = read
    return ov.Model([ops.result(out), ops.result(states["value"])], sinks, [new, beam_idx], "kv")


def _shape_reader(model):
    shape_of = next(op for op in model.get_ops() if op.get_type_name() == "ShapeOf")
    read = shape_of.input_value(0).get_node().input_value(0).get_node()
    return read.get_variable_id()


def _run(model, steps=3):
    request = ov.Core().compile_model(model, "CPU").create_infer_request()
    rng = np.random.default_rng(0)
    outs = []
    for _ in range(steps):
        request.infer({"new": rng.standard_normal((1, HEADS, 1, HEAD_DIM)).astype(np.float32),
                       "beam_idx": np.zeros(1, np.int32)})
        outs.append(request.get_output_tensor(0).data.copy())
    return outs


def test_a_length_read_from_the_value_state_is_read_from_the_key_state():
    model = _graph()
    before = _run(model)
    assert "value" in _shape_reader(model)
    assert read_lengths_from_keys(model) == 1
    model.validate_nodes_and_infer_types()
    assert "key" in _shape_reader(model)
    after = _run(model)
    assert [o.shape for o in after] == [(1, HEADS, n + 1, HEAD_DIM) for n in range(3)]
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["head_dim read", "transposed key layout"])
def test_a_read_the_key_state_cannot_answer_is_left_alone(case):
    if case == "head_dim read":  # the value's head_dim may differ from the key's (MLA): not moved
        model = _graph(value_dims=(0, 1, 2))
        model_dims = _graph(value_dims=(3,))
        assert read_lengths_from_keys(model_dims) == 0
        assert read_lengths_from_keys(model) == 1  # batch, heads and length together are moved
        return
    model = _graph(key_shape=(-1, HEADS, HEAD_DIM, -1))  # keys stored [batch, heads, head_dim, length]
    assert read_lengths_from_keys(model) == 0
    assert "value" in _shape_reader(model)
