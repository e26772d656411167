"""Optimizers for compiled programs, with ``torch.optim``'s definitions and defaults.

Pass one to ``tapejit.compile(loss, inputs=..., params=..., optimizer=opt)``: the program's
``step(x)`` and ``train(X)`` then update by it natively (its moments and step count live in
the program, and in its checkpoints and pickles), at ``opt.lr`` unless given a rate
(``step(x, lr)``); set ``opt.lr`` between steps for a schedule, as with a torch param
group's ``'lr'``; its other settings are read once, by ``compile``, and may not change
afterwards (compile again with a new optimizer). The formulas and their order of operations are ``torch.optim``'s
single-tensor ones (see ``tapejit::optim`` in the Rust docs); over 100 steps they stay within
1e-12 of PyTorch's. Without an optimizer, programs update by plain SGD (``SGD(lr)``).
"""


class Optimizer:
    """What the optimizers share: a learning rate, and their settings for the program."""

    kind = None

    def __init__(self, lr):
        self.lr = lr

    def __setattr__(self, name, value):
        # ``tapejit.compile`` reads the settings but ``lr`` once, and marks the optimizer:
        # a program (or a pickled copy of it) never reads a setting changed afterwards.
        if getattr(self, "_compiled", False) and name != "lr" and name in self._settings()[1]:
            raise AttributeError(
                f"{type(self).__name__}.{name} was read by tapejit.compile: compile again "
                f"with a new optimizer to change it (lr may change between steps)")
        object.__setattr__(self, name, value)

    def _settings(self):
        """The name and settings ``tapejit.compile`` hands to the Rust optimizer."""
        raise NotImplementedError

    def __repr__(self):
        settings = ", ".join(f"{k}={v!r}" for k, v in self._settings()[1].items())
        return f"{type(self).__name__}(lr={self.lr!r}, {settings})"

    def __eq__(self, other):
        return (type(self) is type(other) and self.lr == other.lr
                and self._settings() == other._settings())


class SGD(Optimizer):
    """``torch.optim.SGD``: ``p -= lr * g``, with momentum (its buffer starts as the first
    gradient), dampening, Nesterov momentum and weight decay (added to the gradient)."""

    def __init__(self, lr=1e-3, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(lr)
        self.momentum = momentum
        self.dampening = dampening
        self.nesterov = nesterov
        self.weight_decay = weight_decay

    def _settings(self):
        return "sgd", {"momentum": self.momentum, "dampening": self.dampening,
                       "nesterov": self.nesterov, "weight_decay": self.weight_decay}


class Adam(Optimizer):
    """``torch.optim.Adam``: moments with bias correction; weight decay added to the
    gradient (L2)."""

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(lr)
        self.betas = tuple(betas)
        self.eps = eps
        self.weight_decay = weight_decay

    def _settings(self):
        return "adam", {"betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay}


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay (each param shrinks by
    ``1 - lr * weight_decay`` before the step)."""

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(lr, betas, eps, weight_decay)

    def _settings(self):
        return "adamw", super()._settings()[1]


__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]
