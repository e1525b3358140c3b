"""Train, checkpoint, resume and evaluate a model on a task (``attnlab train`` / ``attnlab eval``).

A run is fully described by a :class:`TrainConfig`. Its output folder holds ``checkpoint/``:

* ``model.safetensors`` — the current weights; ``best.safetensors`` — the weights of the best
  validation score so far (what :func:`evaluate` uses);
* ``config.json`` — the run config, the model config, the step, the validation history;
* ``state.pt`` — optimizer state, PyTorch's RNG state, step, best score, evaluations since
  the best.

The folder is written whole under a temporary name and then renamed into place (the previous
one kept as ``checkpoint.old`` until the rename is done), so a crash at any moment leaves a
complete checkpoint. The order of the training examples is a function of the seed and the
step, and the RNG state is saved, so a run resumed from a checkpoint continues exactly as the
uninterrupted run would have (bitwise on CPU).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .models.heads import BACKBONES, build_model
from . import tasks as task_registry
from .tasks import IGNORE, Task

__all__ = ["TASK_DEFAULTS", "Checkpoint", "CheckpointError", "TrainConfig", "TrainResult", "cross_attention_example", "evaluate", "load_checkpoint", "make_batch", "predict", "train"]

FORMAT = "attnlab-checkpoint"
VERSION = 1

TASK_DEFAULTS: dict[str, dict] = {
    "pos": {"steps": 600, "batch_size": 32, "lr": 2e-3, "dim": 64, "layers": 2, "positional": "rope"},
    "recall": {"steps": 5000, "batch_size": 64, "lr": 2e-3, "dim": 64, "layers": 2, "positional": "rope", "causal": True, "eval_every": 250},
    "listops": {"steps": 3000, "batch_size": 32, "lr": 5e-4, "dim": 64, "layers": 4, "pooling": "cls", "positional": "sinusoidal"},
    "translate": {"steps": 5000, "batch_size": 32, "lr": 2e-3, "dim": 64, "layers": 2, "positional": "sinusoidal"},
    "karate": {"model": "graph_transformer", "steps": 150, "batch_size": 1, "lr": 5e-3, "dim": 32, "layers": 2, "warmup": 10, "eval_every": 10, "patience": None},
    "sbm": {"model": "graph_transformer", "steps": 600, "batch_size": 8, "lr": 2e-3, "dim": 64, "layers": 2, "eval_every": 100},
    "graph_files": {"model": "graph_transformer", "steps": 300, "batch_size": 1, "lr": 5e-3, "dim": 64, "layers": 2, "warmup": 20, "eval_every": 20, "patience": None},
    "digits": {"model": "vit", "steps": 2000, "batch_size": 64, "lr": 2e-3, "dim": 64, "layers": 3, "eval_every": 200, "weight_decay": 0.05},
    "speech": {"model": "conformer", "attention": "local", "positional": "rope", "model_options": {"attention_options": {"window": 16}},
               "steps": 1500, "batch_size": 32, "lr": 2e-3, "dim": 64, "layers": 2, "eval_every": 150},
    "wav_folder": {"model": "conformer", "attention": "local", "positional": "rope", "model_options": {"attention_options": {"window": 16}},
                   "steps": 1500, "batch_size": 32, "lr": 2e-3, "dim": 64, "layers": 2, "eval_every": 150},
    "molecules": {"model": "graph_transformer", "steps": 3000, "batch_size": 64, "lr": 1e-3, "dim": 64, "layers": 3, "pooling": "sum", "eval_every": 250},
}
"""Per-task training defaults (any :class:`TrainConfig` field), calibrated on a 2-core CPU."""


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, truncated, or not written by attnlab."""


@dataclass
class TrainConfig:
    """Everything that defines a training run (stored in the checkpoint's ``config.json``).

    Attributes:
        task, task_options: the task by name (:func:`attnlab.tasks.names`) and its options.
        model: the backbone (:func:`attnlab.models.names`). attention, positional: by name,
            for backbones that use attention; causal: each position attends only to earlier ones. dim, heads, layers: sizes. model_options: any
            further backbone options (``window`` of ``window_mlp``, ``attention_options``, ...).
        pooling: ``mean`` or ``cls`` for classification tasks.
        steps: optimizer steps (or ``epochs`` passes over the training split).
        batch_size, lr, weight_decay, warmup: AdamW with linear warm-up then cosine decay.
        seed: weights, dropout and example order. eval_every: steps between validations and
            checkpoints. patience: stop after this many validations without improvement (None: never).
    """

    task: str
    task_options: dict = field(default_factory=dict)
    model: str = "transformer"
    attention: str = "dense"
    positional: str = "none"
    causal: bool = False
    dim: int = 64
    heads: int = 4
    layers: int = 2
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

    @classmethod
    def for_task(cls, task: str, **overrides) -> TrainConfig:
        """The config with the task's :data:`TASK_DEFAULTS`, then ``overrides`` (None values ignored)."""
        defaults = dict(TASK_DEFAULTS.get(task, {}))
        model = overrides.get("model") or defaults.get("model") or "transformer"
        if model in BACKBONES.names() and not BACKBONES.get(model).uses_attention:
            for key in ("positional", "causal"):  # a task's attention defaults are for attention models
                defaults.pop(key, None)
        if overrides.get("attention") not in (None, defaults.get("attention")) and "attention_options" in defaults.get("model_options", {}):
            # the task's attention options belong to its default variant (e.g. speech's window)
            defaults["model_options"] = {k: v for k, v in defaults["model_options"].items() if k != "attention_options"}
        values = {**defaults, **{k: v for k, v in overrides.items() if v is not None}}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise TypeError(f"unknown training option(s): {', '.join(sorted(unknown))}")
        return cls(task=task, **values)

    def total_steps(self, train_size: int) -> int:
        """Optimizer steps of the run."""
        if self.steps is not None:
            return self.steps
        per_epoch = math.ceil(train_size / self.batch_size)
        return per_epoch * (self.epochs if self.epochs is not None else 10)


def model_config(cfg: TrainConfig, task: Task) -> dict:
    """The JSON model config :func:`attnlab.models.build_model` takes."""
    import inspect

    backbone = BACKBONES.get(cfg.model)
    options = dict(cfg.model_options)
    options["num_layers"] = cfg.layers
    if task.inputs != "tokens":
        if (cfg.attention != "dense" or cfg.positional != "none" or cfg.causal) and not backbone.uses_attention:
            raise ValueError(f"model {cfg.model!r} takes no --attention, --positional or --causal")
        if "num_heads" in inspect.signature(backbone.__init__).parameters:
            options["num_heads"] = cfg.heads
        if backbone.uses_attention:
            options.update(attention=cfg.attention)
            if cfg.positional != "none" or task.inputs != "image":  # ViT keeps its own default (learned)
                options["positional"] = cfg.positional
        if task.inputs == "image":
            options["image_size"] = list(task.split("train").tokens.shape[2:])
        elif backbone.uses_attention:
            options["max_len"] = task.max_len + 1
        return {
            "kind": task.kind, "inputs": task.inputs, "model": cfg.model, "feature_dim": task.feature_dim, "edge_dim": task.edge_dim,
            "num_labels": task.num_labels, "dim": cfg.dim, "pooling": cfg.pooling, "options": options,
        }
    if backbone.uses_attention:
        options.update(num_heads=cfg.heads, attention=cfg.attention, positional=cfg.positional, max_len=task.max_len + 1)
        if cfg.causal:
            options["causal"] = True
    elif cfg.attention != "dense" or cfg.positional != "none" or cfg.causal:
        raise ValueError(f"model {cfg.model!r} uses no attention: --attention, --positional and --causal do not apply to it")
    extra = {"max_target_len": task.split("train").labels.shape[1] + 8} if task.kind == "seq2seq" else {}
    return {
        **extra,
        "kind": task.kind,
        "model": cfg.model,
        "vocab_size": task.vocab_size,
        "num_labels": task.num_labels,
        "dim": cfg.dim,
        "pooling": cfg.pooling,
        "options": options,
    }


@dataclass
class TrainResult:
    """The end of a run: test score with the best weights, and where they are.

    ``step_seconds`` is the time spent in optimizer steps by this call (``steps_run`` of them;
    a resumed run counts only its own), so ``steps_run / step_seconds`` is the training speed.
    ``stopped_by``: ``"steps"``, ``"patience"`` or ``"budget"``.
    """

    task: str
    model: str
    attention: str
    metric: str
    value: float
    seconds: float
    checkpoint: str
    steps: int
    history: list[dict]
    step_seconds: float = 0.0
    steps_run: int = 0
    stopped_by: str = "steps"

    def summary(self) -> dict:
        """The JSON object ``attnlab train --json`` prints."""
        return {k: getattr(self, k) for k in ("task", "model", "attention", "metric", "value", "seconds", "checkpoint")}


def _batch_indices(n: int, batch: int, seed: int, step: int) -> torch.Tensor:
    """The training examples of ``step``: a fixed permutation per epoch, cut in batches."""
    per_epoch = math.ceil(n / batch)
    epoch, i = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return perm[i * batch : (i + 1) * batch]


def attention_label(cfg: TrainConfig) -> str:
    """What the run's summary names as its attention: the variant for attention backbones, the
    backbone's own kind (``"edges"`` for graph attention) otherwise, or ``"none"``."""
    backbone = BACKBONES.get(cfg.model)
    if backbone.uses_attention:
        return cfg.attention
    return getattr(backbone, "attention_kind", "none")


def make_batch(task: Task, data, idx: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """The model's keyword inputs and the labels of examples ``idx`` of a split.

    Tokens: ``{"tokens"}`` with the shared padding columns dropped. Vectors: ``{"x", "pad"}``.
    Graphs: one disjoint union, ``{"x", "edge_index", "edge_attr", "batch", "num_graphs"}``
    (node ``tagging`` labels flattened to the real nodes).
    """
    if task.inputs == "tokens":
        toks, labels = _trim(task, data.tokens[idx], data.labels[idx])
        return {"tokens": toks}, labels
    if task.inputs == "image":
        return {"x": data.tokens[idx]}, data.labels[idx]
    if task.inputs == "features":
        mask = data.mask[idx] if data.mask is not None else torch.ones(data.tokens[idx].shape[:2], dtype=torch.bool)
        keep = max(int(mask.sum(1).max()), 1) if mask.numel() else 1
        return {"x": data.tokens[idx][:, :keep], "pad": ~mask[:, :keep]}, data.labels[idx]
    ids = idx.tolist()
    mask = data.mask[idx]
    counts = mask.sum(1)
    offsets = torch.cumsum(counts, 0) - counts
    x = data.tokens[idx][mask]
    edge_index = torch.cat([data.edges[i] + int(o) for i, o in zip(ids, offsets)], dim=1)
    edge_attr = torch.cat([data.edge_attr[i] for i in ids]) if data.edge_attr is not None else None
    batch = torch.repeat_interleave(torch.arange(len(ids)), counts)
    labels = data.labels[idx][mask] if task.kind == "tagging" else data.labels[idx]
    return {"x": x, "edge_index": edge_index, "edge_attr": edge_attr, "batch": batch, "num_graphs": len(ids)}, labels


def _loss(task: Task, model: nn.Module, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
    if task.kind == "seq2seq":  # teacher forcing: BOS then the target, predicting the target then EOS
        from .models.seq2seq import BOS, TGT_PAD

        tgt_in = torch.cat([torch.full_like(labels[:, :1], BOS), labels[:, :-1]], dim=1)
        logits = model(inputs["tokens"], tgt_in)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=TGT_PAD)
    logits = model(**inputs)
    if task.kind == "regression":
        return nn.functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
    if task.kind == "tagging":
        return nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE)
    return nn.functional.cross_entropy(logits, labels)


def _trim(task: Task, toks: torch.Tensor, labels: torch.Tensor):
    """Drop the padding columns every row of a batch shares."""
    keep = max(int((toks != 0).sum(1).max()), 1) if toks.numel() else 1
    toks = toks[:, :keep]
    if task.kind == "tagging":
        labels = labels[:, :keep]
    elif task.kind == "seq2seq":
        labels = labels[:, : max(int((labels != 0).sum(1).max()), 1)]
    return toks, labels


@torch.no_grad()
def score(model: nn.Module, task: Task, split: str, batch_size: int = 256) -> float:
    """The task's metric of ``model`` on a split."""
    model.eval()
    data = task.split(split)
    right = total = 0
    preds, wants = [], []
    for i in range(0, len(data), batch_size):
        inputs, labels = make_batch(task, data, torch.arange(i, min(i + batch_size, len(data))))
        if task.kind == "seq2seq":  # exact match of the greedy decoding
            decoded = model.greedy(inputs["tokens"], max_len=labels.shape[1] + 4)
            for row, want in zip(decoded, labels.tolist()):
                right += row == [t for t in want if t not in (0, 2)]
            total += len(decoded)
            continue
        if task.kind == "regression":
            preds.append(model(**inputs).squeeze(-1).double())
            wants.append(labels.double())
            continue
        c, t = task.correct(model(**inputs), labels)
        right, total = right + c, total + t
    if task.kind == "regression":  # R^2 = 1 - SSE / SST over the whole split
        p, y = torch.cat(preds), torch.cat(wants)
        sst = float(((y - y.mean()) ** 2).sum())
        return 1.0 - float(((p - y) ** 2).sum()) / sst if sst > 0 else 0.0
    return right / max(total, 1)


def _lr(cfg: TrainConfig, step: int, total: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, total - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


@dataclass
class Checkpoint:
    """A loaded checkpoint: its configs, the model with the chosen weights, and the training state."""

    path: Path
    config: TrainConfig
    model_config: dict
    model: nn.Module
    meta: dict
    state: dict | None


def _write_checkpoint(out: Path, model, best_state, cfg, mcfg, meta, state) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    final, old = out / "checkpoint", out / "checkpoint.old"
    tmp = out / f"checkpoint.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in best_state.items()}, str(tmp / "best.safetensors"))
    torch.save(state, tmp / "state.pt")
    payload = {"format": FORMAT, "version": VERSION, "train": dataclasses.asdict(cfg), "model": mcfg, **meta}
    (tmp / "config.json").write_text(json.dumps(payload, indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)
    return final


def _resolve(path: str | Path) -> Path:
    p = Path(path)
    for cand in (p / "checkpoint", p, p / "checkpoint.old"):
        if (cand / "config.json").exists():
            return cand
    if not p.exists():
        raise CheckpointError(f"no checkpoint at {p}")
    raise CheckpointError(f"{p} is not an attnlab checkpoint folder (no config.json; expected the --out folder of 'attnlab train')")


def load_checkpoint(path: str | Path, *, weights: str = "best", with_state: bool = False) -> Checkpoint:
    """Load a checkpoint folder (or the ``--out`` folder that holds it).

    Args:
        weights: ``"best"`` (best validation score) or ``"last"``.
        with_state: also load the optimizer / RNG state (for resuming).

    Raises:
        CheckpointError: missing, truncated, foreign, or not matching its own config.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = _resolve(path)
    try:
        meta = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder / 'config.json'} is unreadable or truncated: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{folder} was not written by attnlab (config.json has no format {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{folder} has checkpoint version {meta.get('version')}, this attnlab reads version {VERSION}")
    try:
        cfg = TrainConfig(**meta["train"])
        mcfg = meta["model"]
        model = build_model(mcfg)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{folder}: config.json does not describe a model attnlab can build ({e})") from None
    name = "best.safetensors" if weights == "best" else "model.safetensors"
    try:
        tensors = load_file(str(folder / name))
    except (OSError, SafetensorError, RuntimeError) as e:
        raise CheckpointError(f"{folder / name} is truncated or corrupt: {e}") from None
    expected = model.state_dict()
    if set(tensors) != set(expected) or any(tensors[k].shape != expected[k].shape for k in expected):
        raise CheckpointError(f"{folder / name} does not hold the weights of the model its config.json describes")
    model.load_state_dict(tensors)
    state = None
    if with_state:
        try:
            state = torch.load(folder / "state.pt", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
            raise CheckpointError(f"{folder / 'state.pt'} is truncated or corrupt: {e}") from None
    return Checkpoint(folder, cfg, mcfg, model, {k: v for k, v in meta.items() if k not in ("train", "model")}, state)


def train(
    cfg: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    on_step: Callable[[int, int, float], None] | None = None,
    on_eval: Callable[[int, float], None] | None = None,
    max_seconds: float | None = None,
    task: Task | None = None,
) -> TrainResult:
    """Run (or resume) training; returns the test score of the best validation weights.

    Args:
        cfg: the run. out: the output folder (``checkpoint/`` goes in it).
        resume: continue from ``out``'s checkpoint (its config must equal ``cfg``).
        on_step: ``(step, total, loss)`` after each step. on_eval: ``(step, val score)``.
        max_seconds: stop (validate, checkpoint, test) once this call has trained this long.
        task: a task built in Python (e.g. :func:`attnlab.tasks.graphs.task_from_graphs` on
            PyTorch Geometric ``Data`` objects) instead of ``cfg.task`` by name; pass it again to
            resume, and to :func:`evaluate`.

    Data parallel: started by ``torchrun --nproc-per-node N -m attnlab train ...`` (``WORLD_SIZE``
    > 1 in the environment), each process trains a ``DistributedDataParallel`` copy on its share
    of every global batch (``batch_size`` examples, rows ``rank::N``; gloo on CPU, nccl on GPUs)
    and the gradients are averaged; every process validates, only rank 0 writes checkpoints. With
    equal shares (classification, ``batch_size`` divisible by N) the loss trajectory equals the
    single-process one.
    """
    t0 = time.perf_counter()
    out = Path(out)
    rank, world, own_group = _distributed()
    task = task_registry.create(cfg.task, **cfg.task_options) if task is None else task
    mcfg = model_config(cfg, task)
    train_split = task.split("train")
    total = cfg.total_steps(len(train_split))
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, best, since_best, history, resumes, losses = 0, -1.0, 0, [], [], []
    best_state = {k: v.clone() for k, v in model.state_dict().items()}
    if resume:
        ck = load_checkpoint(out, weights="last", with_state=True)
        if dataclasses.asdict(ck.config) != dataclasses.asdict(cfg):
            raise CheckpointError(f"{ck.path} was written by a different run config; resume with the same options or another --out")
        model.load_state_dict(ck.model.state_dict())
        opt.load_state_dict(ck.state["optimizer"])
        torch.set_rng_state(ck.state["rng"])
        step, best, since_best = ck.state["step"], ck.state["best"], ck.state["since_best"]
        history = ck.meta.get("history", [])
        resumes = ck.meta.get("resumes", []) + [step]
        losses = ck.meta.get("losses", [])
        best_state = load_checkpoint(out, weights="best").model.state_dict()
    train_model = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(model)

    def save():
        state = {"optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "step": step, "best": best, "since_best": since_best}
        meta = {"step": step, "total_steps": total, "history": history, "metric": task.metric, "task_artifacts": task.artifacts,
                "resumes": resumes, "losses": losses, "world_size": world}
        if rank != 0:
            return out / "checkpoint"
        return _write_checkpoint(out, model, best_state, cfg, mcfg, meta, state)

    stopped = False
    stopped_by = "steps"
    step_seconds, steps_run = 0.0, 0
    while step < total and not stopped:
        t_step = time.perf_counter()
        model.train()
        idx = _batch_indices(len(train_split), cfg.batch_size, cfg.seed, step)
        if world > 1:
            idx = idx[rank::world]  # this process's share of the global batch
        inputs, labels = make_batch(task, train_split, idx)
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step, total)
        loss = _loss(task, train_model, inputs, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        steps_run += 1
        step_seconds += time.perf_counter() - t_step
        over_budget = max_seconds is not None and time.perf_counter() - t0 >= max_seconds
        if world > 1:  # the global loss, and one decision about the budget for all processes
            import torch.distributed as dist

            both = torch.tensor([float(loss.detach()), float(over_budget)], dtype=torch.float64)
            dist.all_reduce(both)
            loss, over_budget = both[0] / world, bool(both[1] > 0)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, total, float(loss.detach()))
        if step % cfg.eval_every == 0 or step == total or over_budget:
            val = score(model, task, "val")
            history.append({"step": step, "val": val, "loss": float(loss.detach())})
            if val > best:
                best, since_best = val, 0
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
            else:
                since_best += 1
            if on_eval is not None:
                on_eval(step, val)
            if cfg.patience is not None and since_best >= cfg.patience:
                stopped, stopped_by = True, "patience"
            if over_budget:
                stopped, stopped_by = True, "budget"
            save()
    folder = save() if not (out / "checkpoint").exists() else out / "checkpoint"
    if own_group:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    best_model = build_model(mcfg)
    best_model.load_state_dict(best_state)
    value = score(best_model, task, "test")
    return TrainResult(task.name, cfg.model, attention_label(cfg), task.metric, value, time.perf_counter() - t0, str(folder), step, history,
                       step_seconds, steps_run, stopped_by)


def _distributed() -> tuple[int, int, bool]:
    """``(rank, world size, whether this call started the process group)``; starts one (gloo on
    CPU, nccl with GPUs) when launched by torchrun with ``WORLD_SIZE`` > 1."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available():
        return 0, 1, False
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size(), True


def evaluate(path: str | Path, split: str = "test", *, task: Task | None = None) -> TrainResult:
    """Score a checkpoint's best weights on a split of its task (rebuilt from its config, or
    ``task`` for one built in Python)."""
    t0 = time.perf_counter()
    ck = load_checkpoint(path)
    task = task_registry.create(ck.config.task, **ck.config.task_options) if task is None else task
    value = score(ck.model, task, split)
    return TrainResult(
        task.name, ck.config.model, attention_label(ck.config), task.metric, value, time.perf_counter() - t0, str(ck.path),
        ck.meta.get("step", 0), ck.meta.get("history", []),
    )


def cross_attention_example(path: str | Path, index: int = 0, split: str = "test") -> tuple[torch.Tensor, list[str], list[str]]:
    """For a seq2seq checkpoint: greedy-decode example ``index`` of a split and return the last
    decoder block's cross-attention ``(M, N)`` (mean over heads), the source words and the
    generated words (EOS included)."""
    from .models.seq2seq import BOS, EOS

    ck = load_checkpoint(path)
    task = task_registry.create(ck.config.task, **ck.config.task_options)
    if task.kind != "seq2seq":
        raise ValueError(f"task {task.name!r} is {task.kind}: cross-attention exists only for seq2seq tasks")
    data = task.split(split)
    if not 0 <= index < len(data):
        raise ValueError(f"index must be in 0 .. {len(data) - 1}, got {index}")
    src = data.tokens[index : index + 1]
    src = src[:, : max(int((src != 0).sum()), 1)]
    ck.model.eval()
    with torch.no_grad():
        out = ck.model.greedy(src)[0] + [EOS]
        _, w = ck.model(src, torch.tensor([[BOS] + out[:-1]]), return_weights=True)
    words = [task.vocab[t] for t in src[0].tolist()]
    return w[0].mean(0), words, [task.label_names[t] for t in out]


def predict(path: str | Path, records: list[dict], *, beam_size: int | None = None) -> list[dict]:
    """Predictions of a checkpoint for user records (the input field of its jsonl kind):
    tagging ``{"tokens", "labels"}``, classification ``{"text", "label"}``, seq2seq ``{"source", "target"}``."""
    from tokenizers import Tokenizer

    from .tasks.base import pad_rows
    from .tasks.jsonl import FIELDS, encode_inputs

    ck = load_checkpoint(path)
    art = ck.meta.get("task_artifacts") or {}
    if "tokenizer" not in art:
        raise CheckpointError(f"{ck.path} was trained on the built-in task {ck.config.task!r}, not on user data: nothing to predict from")
    kind = art["kind"]
    ids = encode_inputs(kind, art, records)
    names = art["labels"]
    model = ck.model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(ids), 64):
            chunk, recs = ids[i : i + 64], records[i : i + 64]
            toks = pad_rows(chunk, 0)
            if kind == "seq2seq":
                tgt = Tokenizer.from_str(art["target_tokenizer"])
                rows = model.beam(toks, beam_size) if beam_size else model.greedy(toks)
                out += [{"source": r["source"], "target": tgt.decode(row)} for r, row in zip(recs, rows)]
            elif kind == "tagging":
                pred = model(toks).argmax(-1).tolist()
                out += [{"tokens": r["tokens"], "labels": [names[p] for p in row[: len(ids_)]]} for r, row, ids_ in zip(recs, pred, chunk)]
            else:
                pred = model(toks).argmax(-1).tolist()
                out += [{FIELDS[kind][0]: r[FIELDS[kind][0]], "label": names[p]} for r, p in zip(recs, pred)]
    return out
