"""The typed description of a training run: :class:`TrainConfig`, and :func:`model_config`,
which turns a run and its task into the :class:`attnlab.models.ModelConfig` of its model."""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field

from ..devices import DEVICES
from ..models.base import BACKBONES
from ..models.config import AttentionSpec, ModelConfig, PositionalSpec
from ..tasks import TASKS, Task, baseline_model, train_defaults
from ..validate import ArgumentTypeError
from .precision import PRECISIONS

__all__ = ["FORMER_NAMES", "LATER_FIELDS", "TIME_BUDGET_STEPS", "TrainConfig", "model_config", "time_budget"]

TIME_BUDGET_STEPS = 1_000_000
"""The step cap of a run given only a time budget (``seconds``): never the limit in practice."""

LATER_FIELDS = {"seconds": None, "precision": "fp32", "compile": False, "pretrain_steps": 0, "pretrain_share": 0.5,
                "device": "cpu"}
""":class:`TrainConfig` fields added after arena runs were first stored, with the value every earlier
run had: a run at those values keeps the arena id it was planned under before the field existed,
and the board reads a stored config without the field as having that value."""

FORMER_NAMES = {"dim": "embed_dim", "heads": "num_heads", "layers": "num_layers"}
""":class:`TrainConfig` fields under their earlier names -> their names now: the model's width,
heads and blocks took the names the layers give them (:class:`attnlab.MultiHeadAttention`'s
``embed_dim``, ``num_heads``; the encoder's ``num_layers``). Checkpoints written before hold the
earlier keys (:meth:`TrainConfig.from_dict` reads them); arena run ids are hashed under them."""


def time_budget(values: dict, given: dict) -> dict:
    """The time-budget rule, in one place: when the caller's own settings ``given`` hold ``seconds``
    and neither ``steps`` nor ``epochs``, the seconds are the limit (``steps`` =
    :data:`TIME_BUDGET_STEPS`, no epochs); without a ``patience`` of the caller's, no early stop
    (every run trains its whole budget). Returns ``values`` (the config's fields) so amended."""
    if given.get("seconds") is None:
        return values
    out = dict(values)
    if given.get("steps") is None and given.get("epochs") is None:
        out["steps"], out["epochs"] = TIME_BUDGET_STEPS, None
    if given.get("patience") is None:
        out["patience"] = None
    return out


@dataclass
class TrainConfig:
    """Everything that defines a training run (stored in the checkpoint's ``config.json``).

    Attributes:
        task, task_options: the task by name (:func:`attnlab.tasks.names`) and its options.
        model: the backbone (:func:`attnlab.models.names`). attention, attention_options: the
            attention variant by name and its options (``window=``, ...), for backbones that use
            attention; positional: the encoding by name; causal: each position attends only to
            earlier ones. embed_dim, num_heads, num_layers: the model's width, heads and blocks
            (the names :class:`attnlab.MultiHeadAttention` and the encoder give them).
            model_options: any further backbone option (``window`` of ``window_mlp``, ...).
        pooling: ``mean`` or ``cls`` for classification tasks.
        steps: optimizer steps, or ``epochs``: passes over the training split (give one; neither:
            10 epochs).
        batch_size, lr, weight_decay, warmup: AdamW with linear warm-up then cosine decay.
        seed: weights, dropout and example order. eval_every: steps between validations and
            checkpoints. patience: stop after this many validations without improvement (None: never).
        seconds: a time budget: stop once the optimizer steps have taken this many seconds
            (summed over resumes; validation not counted), with the learning rate's cosine decay
            following the budget's elapsed fraction (or the steps', whichever is further), so a
            run that stops on time has annealed. ``steps`` still caps the run. Runs under a time
            budget are not bitwise reproducible: how far they get depends on the machine.
        precision: ``fp32``, ``bf16`` (matrix products in bfloat16 under autocast, float32
            weights and loss) or ``auto`` (``bf16`` where the device does it natively): see
            :mod:`attnlab.training.precision`. Validation and test run at the same precision.
        compile: run the training forward through :func:`torch.compile`.
        pretrain_steps: self-pretraining first (:mod:`attnlab.objectives.denoising`: restore masked
            tokens, or predict the next one, on the training split's own inputs) for at most this
            many steps, then fine-tuning on the labels from those weights (0: none). Under a time
            budget, pretraining stops after ``pretrain_share`` of ``seconds`` and fine-tuning gets
            the rest: the budget covers both phases.
        device: where the model and every batch live (:func:`attnlab.devices.resolve`: ``auto``
            is CUDA where present, else the CPU). A run may resume on another device; scores on
            another kind of device agree to rounding, not bit for bit.
    """

    task: str
    task_options: dict = field(default_factory=dict)
    model: str = "transformer"
    attention: str = "dense"
    positional: str = "none"
    causal: bool = False
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    model_options: dict = field(default_factory=dict)
    pooling: str = "mean"
    steps: int | None = None
    epochs: int | None = None
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 100
    seed: int = 0
    eval_every: int = 200
    patience: int | None = 5
    attention_options: dict = field(default_factory=dict)
    seconds: float | None = None
    precision: str = "fp32"
    compile: bool = False
    pretrain_steps: int = 0
    pretrain_share: float = 0.5
    device: str = "auto"

    def __post_init__(self):
        if "attention_options" in self.model_options:  # where version-1 configs kept them
            opts = dict(self.model_options)
            self.attention_options = {**opts.pop("attention_options"), **self.attention_options}
            self.model_options = opts
        if self.steps is not None and self.epochs is not None:
            raise ValueError(f"give steps or epochs, not both (got steps={self.steps}, epochs={self.epochs})")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"seconds (a time budget) must be > 0, got {self.seconds}")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a string ({DEVICES}), got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not isinstance(self.pretrain_steps, int) or self.pretrain_steps < 0:
            raise ValueError(f"pretrain_steps must be an int >= 0, got {self.pretrain_steps!r}")
        if not 0 < self.pretrain_share < 1:
            raise ValueError(f"pretrain_share (of a time budget) must be in (0, 1), got {self.pretrain_share}")
        # before any model is built: a rotary encoding would otherwise report the odd head width
        if _takes_heads(self.model):
            for name in ("embed_dim", "num_heads"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name} must be a positive int, got {value!r}")
            if self.embed_dim % self.num_heads:
                fits = [h for h in range(1, min(self.embed_dim, 16) + 1) if self.embed_dim % h == 0]
                raise ValueError(f"embed_dim {self.embed_dim} must be divisible by num_heads {self.num_heads} (each "
                                 "head takes embed_dim / num_heads of the width): num_heads "
                                 f"{', '.join(map(str, fits))} divide {self.embed_dim}")

    @classmethod
    def for_task(cls, task: str, **overrides) -> TrainConfig:
        """The config with the task's own training defaults (:func:`attnlab.tasks.train_defaults`),
        then ``overrides`` (None values ignored). ``epochs`` replaces a default ``steps``; ``seconds``
        follows :func:`time_budget`."""
        defaults = train_defaults(task, overrides.get("task_options")) if task in TASKS else {}
        model = overrides.get("model") or defaults.get("model") or "transformer"
        if model in BACKBONES and not BACKBONES.get(model).uses_attention:
            for key in ("positional", "causal"):  # a task's attention defaults are for attention models
                defaults.pop(key, None)
        if overrides.get("attention") not in (None, defaults.get("attention")):
            defaults.pop("attention_options", None)  # the task's attention options belong to its default variant
        if overrides.get("epochs") is not None and overrides.get("steps") is None:
            defaults.pop("steps", None)
        values = time_budget({**defaults, **{k: v for k, v in overrides.items() if v is not None}}, overrides)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ArgumentTypeError(f"unknown training option(s): {', '.join(sorted(unknown))}")
        return cls(task=task, **values)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """The config of a checkpoint's or a record's ``train`` dict (any version; runs stored
        before precisions existed trained in float32)."""
        # stored before the sizes were renamed: dim, heads, layers (FORMER_NAMES) -> embed_dim, num_heads, num_layers
        return cls(**{FORMER_NAMES.get(k, k): v for k, v in data.items()})

    def baseline(self) -> TrainConfig:
        """This run's **no-attention baseline**: the task's :func:`attnlab.tasks.baseline_model`
        (``mlp``: each token alone, mean-pooled for a set) on the same task, budget (steps,
        epochs or seconds), batch, learning rate and seed, with no attention settings (a summary
        token means nothing without attention: ``cls`` pooling becomes ``mean``); its precision,
        ``compile`` and self-pretraining are this run's (the same recipe). ``ValueError`` when the
        task has no such model."""
        model = baseline_model(self.task) if self.task in TASKS else None
        if model is None:
            raise ValueError(f"task {self.task!r} has no no-attention baseline model")
        return dataclasses.replace(self, model=model, attention="dense", attention_options={}, positional="none",
                                   causal=False, model_options={},
                                   pooling="mean" if self.pooling == "cls" else self.pooling)

    def total_steps(self, train_size: int) -> int:
        """Optimizer steps of the run."""
        if self.steps is not None:
            return self.steps
        per_epoch = math.ceil(train_size / self.batch_size)
        return per_epoch * (self.epochs if self.epochs is not None else 10)


def _takes_heads(model: str) -> bool:
    """Whether the backbone ``model`` splits its width into attention heads (it uses attention, or
    takes ``num_heads``: the graph transformer)."""
    if model not in BACKBONES:
        return False
    backbone = BACKBONES.get(model)
    return backbone.uses_attention or "num_heads" in inspect.signature(backbone.__init__).parameters


def model_config(cfg: TrainConfig, task: Task) -> ModelConfig:
    """The :class:`attnlab.models.ModelConfig` of a run's model on ``task``."""
    backbone = BACKBONES.get(cfg.model)
    takes_attention = backbone.uses_attention
    if not takes_attention and (cfg.attention != "dense" or cfg.positional != "none" or cfg.causal
                                or cfg.attention_options):
        if task.inputs != "tokens":
            raise ValueError(f"model {cfg.model!r} takes no --attention, --positional or --causal")
        raise ValueError(f"model {cfg.model!r} uses no attention: --attention, --positional and --causal do not apply "
                         "to it")
    fields: dict = {"kind": task.kind, "model": cfg.model, "num_labels": task.num_labels, "embed_dim": cfg.embed_dim,
                    "pooling": cfg.pooling, "num_layers": cfg.num_layers, "options": dict(cfg.model_options)}
    if takes_attention:
        fields["attention"] = AttentionSpec(cfg.attention, dict(cfg.attention_options))
    if task.inputs == "tokens":
        fields["vocab_size"] = task.vocab_size
        if takes_attention:
            fields.update(num_heads=cfg.num_heads, positional=PositionalSpec(cfg.positional), max_len=task.max_len + 1,
                          causal=cfg.causal)
        if task.kind == "seq2seq":
            fields["max_target_len"] = task.split("train").labels.shape[1] + 8
        return ModelConfig(**fields)
    fields.update(inputs=task.inputs, feature_dim=task.feature_dim, edge_dim=task.edge_dim)
    if "num_heads" in inspect.signature(backbone.__init__).parameters:
        fields["num_heads"] = cfg.num_heads
    if takes_attention and (cfg.positional != "none" or task.inputs != "image"):  # ViT keeps its own default (learned)
        fields["positional"] = PositionalSpec(cfg.positional)
    if task.inputs == "image":
        fields["options"]["image_size"] = list(task.split("train").tokens.shape[2:])
    elif takes_attention:
        fields["max_len"] = task.max_len + 1
    return ModelConfig(**fields)
