"""The logits slice (graph/logits.py): one position's logits, equal to that position of the full logits."""

from __future__ import annotations

import numpy as np
import pytest

import optimum_shared_graph as osg
from optimum_shared_graph import ModelNotSupportedError
from optimum_shared_graph.graph.logits import is_sliced, slice_logits
from optimum_shared_graph.runtimes.session import EXACT_CONFIG, GraphSession


@pytest.fixture(scope="module")
def all_logits_graph(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("logits") / "all"
    osg.export(str(tiny_model("llama")), out, logits="all", quiet=True)
    return out / "openvino_model.xml"


def _logits(graph, ids):
    import openvino as ov

    session = GraphSession(ov.Core().compile_model(graph, "CPU", EXACT_CONFIG))
    session.reset()
    first = session.step(ids)
    return first, session.step(ids[:, -1:])


def test_slice_keeps_the_last_position_exactly(all_logits_graph):
    import openvino as ov

    full = ov.Core().read_model(all_logits_graph)
    sliced = ov.Core().read_model(all_logits_graph)
    assert not is_sliced(sliced)
    slice_logits(sliced)
    assert is_sliced(sliced) and sliced.output("logits").get_partial_shape()[1].get_length() == 1
    ids = np.array([[5, 9, 17, 33, 65, 129], [7, 8, 9, 10, 11, 12]], dtype=np.int64)
    (full_prefill, full_decode), (one_prefill, one_decode) = _logits(full, ids), _logits(sliced, ids)
    assert full_prefill.shape[1] == 6 and one_prefill.shape[1] == 1
    np.testing.assert_allclose(one_prefill[:, 0], full_prefill[:, -1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(one_decode[:, 0], full_decode[:, -1], rtol=0, atol=1e-5)


def test_a_graph_without_logits_is_refused_in_one_line():
    import openvino as ov

    ids = ov.opset13.parameter([-1, -1], ov.Type.f32, name="input_ids")
    graph = ov.Model([ov.opset13.result(ids)], [ids], "no-logits")
    with pytest.raises(ModelNotSupportedError, match="has no 'logits' output"):
        slice_logits(graph)
