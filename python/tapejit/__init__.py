"""tapejit: micrograd's API, compiled.

``Value`` is micrograd's: a number, its gradient, and the operators that build a graph
(``data`` is computed as soon as a value is built). ``backward()`` runs the graph's tape: the
first time a graph of some structure is seen, on tapejit's interpreter; from the second time
(micrograd code rebuilds the same graph every step), as native code compiled once.
``tapejit.nn`` is micrograd's ``nn`` over this ``Value``.

``compile(loss, inputs, params, optimizer=...)`` builds a graph once for loops that run it
many times: its ``Program`` steps and trains on numpy arrays natively (``step(x)``,
``train(X)``), updating by a ``tapejit.optim`` optimizer (``SGD``, ``Adam``, ``AdamW``, with
torch.optim's definitions), or by plain SGD at the rate given (``step(x, lr)``).

``draw_dot(value)`` draws the graph under a value, as micrograd's notebook does.

``with tapejit.detect_anomaly():`` names the first value that makes a NaN or an infinity,
and where it was made (``tapejit.anomaly``).
"""

from ._tapejit import Program, Value, compile
from . import datasets, nn, optim
from .anomaly import detect_anomaly, set_detect_anomaly
from .viz import draw_dot

__all__ = ["Program", "Value", "compile", "datasets", "detect_anomaly", "draw_dot", "nn", "optim",
           "set_detect_anomaly"]
