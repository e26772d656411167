"""tapejit: micrograd's API, compiled.

``Value`` is micrograd's: a number, its gradient, and the operators that build a graph
(``data`` is computed as soon as a value is built). ``backward()`` runs the graph's tape: the
first time a graph of some structure is seen, on tapejit's interpreter; from the second time
(micrograd code rebuilds the same graph every step), as native code compiled once.
``tapejit.nn`` is micrograd's ``nn`` over this ``Value``.
"""

from ._tapejit import Value
from . import nn

__all__ = ["Value", "nn"]
