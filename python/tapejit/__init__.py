"""tapejit: micrograd's API, compiled.

``Value`` is micrograd's: a number, its gradient, and the operators that build a graph
(``data`` is computed as soon as a value is built). ``backward()`` runs the graph's tape: the
first time a graph of some structure is seen, on tapejit's interpreter; from the second time
(micrograd code rebuilds the same graph every step), on the JIT: its first tier at once,
native code once compiled in the background. ``tapejit.nn`` is micrograd's ``nn`` over this
``Value``.

``compile(loss, inputs, params, optimizer=...)`` builds a graph once for loops that run it
many times: its ``Program`` steps and trains on numpy arrays (``step(x)``, ``train(X)``),
updating by a ``tapejit.optim`` optimizer (``SGD``, ``Adam``, ``AdamW``, with torch.optim's
definitions), or by plain SGD at the rate given (``step(x, lr)``). It runs the JIT's first
tier until native code is compiled (``tiering=``, ``Program.tier``, ``wait_for_native()``).

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
