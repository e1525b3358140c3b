"""Train, checkpoint, resume and evaluate a model on a task (``attnlab train`` / ``attnlab eval``).

==================  ===================================================================
module              what it holds
==================  ===================================================================
``config``          :class:`TrainConfig` (typed; steps *or* epochs) and :func:`model_config`
``checkpoint``      atomic checkpoint folders, :func:`load_checkpoint` (versions 1 and 2)
``loop``            :func:`train` (incl. resuming, time budgets, DDP under torchrun)
``run``             where a call of :func:`train` stands, and the checkpoint that saves it
``parallel``        the loop's processes: torchrun's group, sequence groups, gradients averaged
``inference``       :func:`evaluate`, :func:`predict`, :func:`cross_attention_example`, :func:`generate`
``precision``       mixed precision: ``fp32``, ``bf16`` (autocast), ``auto``
``caveats``         why a score means less than it seems (tiny test split, too few steps)
==================  ===================================================================

The loss and the metric of each kind of output are :mod:`attnlab.objectives`; the per-task
defaults belong to the tasks (:func:`attnlab.tasks.train_defaults`).
"""

from ..models.config import AttentionSpec, ModelConfig, PositionalSpec
from ..objectives import collate as make_batch
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .config import TrainConfig, model_config
from .inference import cross_attention_example, evaluate, generate, predict, prediction_accuracy, score
from .loop import (
    BUDGET_FIELDS,
    ConfigMismatchError,
    RunExistsError,
    TrainResult,
    attention_label,
    config_differences,
    train,
)

__all__ = [
    "BUDGET_FIELDS",
    "ConfigMismatchError",
    "RunExistsError",
    "config_differences",
    "AttentionSpec",
    "Checkpoint",
    "CheckpointError",
    "ModelConfig",
    "PositionalSpec",
    "TrainConfig",
    "TrainResult",
    "attention_label",
    "cross_attention_example",
    "evaluate",
    "generate",
    "load_checkpoint",
    "make_batch",
    "model_config",
    "predict",
    "prediction_accuracy",
    "score",
    "train",
]
