"""Anomaly mode, as ``torch.autograd.detect_anomaly``::

    with tapejit.detect_anomaly():
        loss = model(x)          # an op that makes NaN or inf of finite numbers raises here
        loss.backward()          # a non-finite derivative names the value and where it was made

While it is on, every value made remembers the file and line that made it (the innermost
frame outside tapejit), an op that turns finite operands into a NaN or an infinity raises
``FloatingPointError`` at once (as micrograd's ``math.log(-1)`` raises), and ``backward``
and compiled programs' ``step`` and ``train`` check every value and gradient, raising
``FloatingPointError`` that names the first value whose derivative was not finite, its op
and operands, and where it was made. Slower: for finding where a NaN comes from.
"""

from ._tapejit import set_detect_anomaly


class detect_anomaly:
    """Anomaly mode on (or off, ``detect_anomaly(False)``) inside a ``with`` block, as it was
    afterwards; ``tapejit.set_detect_anomaly(True)`` turns it on for good."""

    def __init__(self, mode=True):
        self.mode = mode

    def __enter__(self):
        self.was = set_detect_anomaly(self.mode)
        return self

    def __exit__(self, *exc):
        set_detect_anomaly(self.was)
        return False


__all__ = ["detect_anomaly", "set_detect_anomaly"]
