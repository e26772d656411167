"""draw_dot: micrograd's picture of a graph (every node's op, data and grad), and a large
graph summarised by its loops."""

import shutil

import tapejit
from tapejit import Value, draw_dot


def neuron():
    x1, x2 = Value(2.0), Value(0.0)
    w1, w2 = Value(-3.0), Value(1.0)
    b = Value(6.8813735870195432)
    o = (x1 * w1 + x2 * w2 + b).tanh()
    o.backward()
    return o


def test_every_node_with_its_data_and_grad():
    dot = draw_dot(neuron()).source
    assert dot.startswith("digraph tape {")
    assert sum("[label=" in line for line in dot.splitlines()) == 10
    assert sum("->" in line for line in dot.splitlines()) == 9
    assert "tanh (loss) | data 0.7071 | grad 1 }" in dot
    assert "data -3 | grad 1 }" in dot  # w1: its grad is x1 * 0.5


def test_a_large_graph_is_summarised(tmp_path):
    model = tapejit.nn.MLP(2, [8, 1])
    scores = [model([Value(0.1 * i), Value(-0.1 * i)]) for i in range(60)]
    loss = sum((1 + -s).relu() for s in scores)
    dot = draw_dot(loss).source
    assert len(dot.splitlines()) < 40 and "nest:" in dot


def test_save_writes_svg_with_graphviz_and_dot_text_without(tmp_path):
    path = draw_dot(neuron()).save(str(tmp_path / "neuron"))
    if shutil.which("dot"):
        assert path.endswith(".svg") and "<svg" in open(path).read()
    else:
        assert path.endswith(".dot") and open(path).read().startswith("digraph")
