"""micrograd's trace_graph notebook: a neuron, its backward, and a picture of its graph.

    python python/examples/draw.py [STEM]

Writes STEM.svg (default: neuron.svg) when Graphviz's `dot` is installed, else STEM.dot, the
DOT text it would render; then a picture of micrograd's moons loss (100 copies of an MLP),
which tapejit summarises by its loops.
"""

import sys

import tapejit
from tapejit import Value, draw_dot

stem = sys.argv[1] if len(sys.argv) > 1 else "neuron"

# a very simple example, from the notebook
x1, x2 = Value(2.0), Value(0.0)
w1, w2 = Value(-3.0), Value(1.0)
b = Value(6.8813735870195432)
n = x1 * w1 + x2 * w2 + b
o = n.tanh()
o.backward()
print("wrote", draw_dot(o).save(stem))

# a large graph: the moons loss over 100 points
model = tapejit.nn.MLP(2, [16, 16, 1])
X = [[0.1 * i, -0.05 * i] for i in range(100)]
scores = [model(list(map(Value, row))) for row in X]
loss = sum((1 + -(1 if i % 2 else -1) * s).relu() for i, s in enumerate(scores)) * 0.01
print(draw_dot(loss).source)
