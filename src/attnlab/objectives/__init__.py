"""Objectives, one per kind of output: the loss of a batch and the metric of a split.

==================  ============================================  ============================
kind                loss                                          metric
==================  ============================================  ============================
``tagging``         cross-entropy per vector / node (IGNORE off)  accuracy over scored ones
``classification``  cross-entropy per set / graph                 accuracy
``pair``            cross-entropy per pair (two-tower model)      accuracy
``regression``      mean squared error                            R^2 over the split
``seq2seq``         teacher-forced cross-entropy                  exact match, greedy decoding
``lm``              next-token cross-entropy                      perplexity (lower is better)
==================  ============================================  ============================

Beside them, :class:`Denoising` (``objectives/denoising.py``) is the self-pretraining objective of
any token task: restore masked tokens, or predict the next one, on the task's own inputs.

``objectives.get(task)`` gives a task's objective; :func:`collate` makes a batch from any input
form (tokens, vectors, images, graphs as one disjoint union).
"""

from . import classification as _classification  # noqa: F401  (each import registers its objective)
from . import lm as _lm  # noqa: F401
from . import pair as _pair  # noqa: F401
from . import regression as _regression  # noqa: F401
from . import seq2seq as _seq2seq  # noqa: F401
from . import tagging as _tagging  # noqa: F401
from .base import OBJECTIVES, Objective, batches, collate, create, get, model_device, names, register
from .denoising import Denoising, DenoisingModel

__all__ = ["OBJECTIVES", "Denoising", "DenoisingModel", "Objective", "batches", "collate", "create", "get",
           "model_device", "names", "register"]
