"""Efficient attention: variants that avoid the N x N matrix, behind one interface.

Each variant is an attention step (:class:`attnlab.layers.step.AttentionStep`) or a sequence
mixer (:class:`attnlab.layers.mixer.SequenceMixer`, ``select(mixer=True)``).
``create(name, embed_dim=..., num_heads=..., **options)`` returns the layer: the
:class:`attnlab.MultiHeadAttention` holding a step, or the mixer itself; ``step(name, ...)`` a
step alone, to call on heads (``step(q, k, v)``) as :func:`attnlab.attend` is; ``names()`` names them (the registry is
:data:`VARIANTS`). The gated linear-attention family (``select(family="gated")``) shares
:class:`GatedRecurrence` and the three forms of :mod:`attnlab.efficient.recurrence`.
``"dense"`` is exact attention. A module of this package that registers a variant is imported
and its class exported here without being named: adding a variant is its file. Each declares what
its step or mixer can do (``capabilities``); ``select(causal=True, ...)`` lists the variants by it. ``budget(name)``
is a variant's :class:`Budget`: its settings at short and long lengths and its budget axis.
"""

# each import registers its variant(s); this order (after "dense") is the order of budgets(),
# so of the arena's, the scaling benchmark's and the approximation table's variants: keep it
# (a module not named here joins after them: see the end of this file)
# isort: off
from . import local as _local  # noqa: F401
from . import longformer as _longformer  # noqa: F401  (longformer, bigbird)
from . import linformer as _linformer  # noqa: F401
from . import performer as _performer  # noqa: F401
from . import linear as _linear  # noqa: F401
from . import retnet as _retnet  # noqa: F401
from . import gla as _gla  # noqa: F401
from . import deltanet as _deltanet  # noqa: F401  (deltanet, gated_deltanet)
from . import kda as _kda  # noqa: F401
from . import mamba2 as _mamba2  # noqa: F401
from . import fox as _fox  # noqa: F401
from . import reformer as _reformer  # noqa: F401
from . import nystrom as _nystrom  # noqa: F401
from . import naive as _naive  # noqa: F401
# isort: on
from ..layers.exact import DenseStep
from ..layers.step import AttentionStep, StepCall
from .base import (
    LAYER_OPTIONS,
    VARIANTS,
    Budget,
    EfficientStep,
    PatternStep,
    Sweep,
    VariantRegistry,
    budget,
    budgets,
    capabilities,
    create,
    is_mixer,
    names,
    register,
    select,
    step,
)
from .deltanet import DeltaNetAttention, GatedDeltaNetAttention
from .fox import ForgettingAttention
from .gated import GatedRecurrence, MatrixState
from .gla import GatedLinearAttention
from .kda import KimiDeltaAttention
from .kernel import kernel_attention
from .linear import LinearAttention, elu_feature_map
from .linformer import LinformerAttention
from .local import LocalAttention, banded_attention
from .longformer import BigBirdAttention, LongformerAttention
from .mamba2 import Mamba2Attention
from .naive import NaiveDenseAttention
from .nystrom import NystromAttention, iterative_pinv, segment_means
from .performer import PerformerAttention, favor_features, orthogonal_gaussian
from .reformer import ReformerAttention, lsh_buckets
from .retnet import RetentionAttention, retention_decays

__all__ = [
    "VARIANTS",
    "LAYER_OPTIONS",
    "VariantRegistry",
    "create",
    "is_mixer",
    "step",
    "AttentionStep",
    "StepCall",
    "names",
    "register",
    "budget",
    "budgets",
    "capabilities",
    "select",
    "Budget",
    "DenseStep",
    "Sweep",
    "EfficientStep",
    "PatternStep",
    "LocalAttention",
    "LongformerAttention",
    "BigBirdAttention",
    "LinearAttention",
    "elu_feature_map",
    "kernel_attention",
    "LinformerAttention",
    "NaiveDenseAttention",
    "NystromAttention",
    "iterative_pinv",
    "segment_means",
    "ReformerAttention",
    "lsh_buckets",
    "PerformerAttention",
    "favor_features",
    "orthogonal_gaussian",
    "banded_attention",
    "GatedRecurrence",
    "MatrixState",
    "RetentionAttention",
    "retention_decays",
    "GatedLinearAttention",
    "DeltaNetAttention",
    "GatedDeltaNetAttention",
    "KimiDeltaAttention",
    "Mamba2Attention",
    "ForgettingAttention",
]


def _discover() -> None:
    """Import every other module of this package (a variant's file registers it on import, after
    the ones above) and export every registered step class by its name."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")
    for name in VARIANTS.in_order():
        cls = VARIANTS.get(name)
        if cls.__module__.startswith(__name__) and cls.__name__ not in __all__:
            globals()[cls.__name__] = cls
            __all__.append(cls.__name__)


_discover()
