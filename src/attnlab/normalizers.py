"""Normalisers ``a'_i = norm(s_i)`` by name: the public face of :mod:`attnlab.core.normalize`.

``create(name)`` returns the function ``(scores, mask) -> weights``; ``names()`` lists them;
:data:`NORMALIZERS` is the registry.
"""

from .core.normalize import NORMALIZERS, create, names, relu, sigmoid, softmax

__all__ = ["NORMALIZERS", "softmax", "relu", "sigmoid", "create", "names"]
