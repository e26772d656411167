"""Pictures of a graph, as micrograd's trace_graph notebook draws them: ``draw_dot(value)``.

The DOT text comes from tapejit (``tapejit::dot::graph_to_dot`` in Rust): one box per node with its op,
``data`` and ``grad``; a graph of more than 300 nodes is summarised by the loops tapejit
finds in it. Graphviz's ``dot`` program, if installed, turns it into SVG.
"""

import shutil
import subprocess

from ._tapejit import to_dot


class Dot:
    """A graph's picture: ``source`` is its DOT text; ``svg()`` renders it with Graphviz
    (``None`` without Graphviz), which is also how Jupyter shows it inline."""

    def __init__(self, source):
        self.source = source

    def svg(self):
        dot = shutil.which("dot")
        if dot is None:
            return None
        done = subprocess.run([dot, "-Tsvg"], input=self.source.encode(), capture_output=True, check=True)
        return done.stdout.decode()

    def _repr_svg_(self):
        return self.svg()

    def save(self, stem):
        """Writes ``stem.svg`` if Graphviz is installed, else ``stem.dot``; returns the path."""
        svg = self.svg()
        path, text = (f"{stem}.svg", svg) if svg is not None else (f"{stem}.dot", self.source)
        with open(path, "w") as f:
            f.write(text)
        return path

    def __str__(self):
        return self.source


def draw_dot(root):
    """The graph under ``root`` (a ``Value``), its nodes labelled with their data and grad."""
    return Dot(to_dot(root))
