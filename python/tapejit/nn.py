"""micrograd's nn (MIT, Andrej Karpathy), over tapejit's Value: the same code, so models
written for micrograd run unchanged after changing the import. ``MLP`` adds ``save`` and
``load`` (safetensors, named as PyTorch names ``nn.Linear``'s: ``layers.0.weight``, ...)."""

import random

from ._tapejit import Value, load_params, micrograd_params, save_params


class Module:

    def zero_grad(self):
        for p in self.parameters():
            p.grad = 0

    def parameters(self):
        return []


class Neuron(Module):

    def __init__(self, nin, nonlin=True):
        self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
        self.b = Value(0)
        self.nonlin = nonlin

    def __call__(self, x):
        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return act.relu() if self.nonlin else act

    def parameters(self):
        return self.w + [self.b]

    def __repr__(self):
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):

    def __init__(self, nin, nout, **kwargs):
        self.neurons = [Neuron(nin, **kwargs) for _ in range(nout)]

    def __call__(self, x):
        out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def parameters(self):
        return [p for n in self.neurons for p in n.parameters()]

    def __repr__(self):
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module):

    def __init__(self, nin, nouts):
        sz = [nin] + nouts
        self.sizes = sz
        self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1) for i in range(len(nouts))]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self):
        return [p for layer in self.layers for p in layer.parameters()]

    def __repr__(self):
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"

    def init_from_seed(self, seed):
        """Sets the params to micrograd's initialization (weights uniform in [-1, 1), biases
        0) drawn from tapejit's seeded generator: the same seed gives the Rust examples' MLP
        (``tapejit::datasets::micrograd_params``)."""
        for p, x in zip(self.parameters(), micrograd_params(self.sizes, seed)):
            p.data = x
        return self

    def save(self, path):
        """Writes the params to ``path`` as safetensors: ``layers.{l}.weight`` (one row per
        neuron) and ``layers.{l}.bias``, float64, the sizes in the metadata; what tapejit's
        Rust trainer writes and reads (``--save``, ``--load``), and PyTorch and numpy read."""
        save_params(str(path), self.sizes, [p.data for p in self.parameters()])

    def load(self, path):
        """Sets the params from a checkpoint saved for these sizes (by ``save``, or the Rust
        trainer); one saved for other sizes, or holding another number of params, is a
        ``ValueError`` that names both."""
        params = self.parameters()
        for p, x in zip(params, load_params(str(path), self.sizes, len(params))):
            p.data = x
