"""Data for the demos, from tapejit's seeded generators (the Rust examples use the same:
the same seed gives the same numbers), so they need no scikit-learn."""

from ._tapejit import make_moons, micrograd_params

__all__ = ["make_moons", "micrograd_params"]
