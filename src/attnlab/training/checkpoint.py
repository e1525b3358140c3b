"""Checkpoints: a folder written whole under a temporary name and renamed into place, so a
crash at any moment leaves a complete one.

``checkpoint/`` holds ``model.safetensors`` (the current weights), ``best.safetensors`` (the
weights of the best validation score so far), ``config.json`` (the run config, the model
config, the step, the validation history) and ``state.pt`` (optimizer state, PyTorch's RNG
state, step, best score, evaluations since the best). The previous folder is kept as
``checkpoint.old`` until the rename is done.

Version 2 stores the typed :class:`attnlab.models.ModelConfig` (attention and positional
encoding as specs); version-1 checkpoints (a flat model dict, attention options among the
backbone options) still load and predict identically. Weights written before a layer held its
attention step load through the layer's own hook (:func:`attnlab.layers.migration.step_keys`), and
their optimizer state is put in today's order of the parameters, so such a run also resumes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..devices import resolve as resolve_device
from ..layers.migration import parameters_before_step, parameters_with_step
from ..layers.mixer import SequenceMixer
from ..models.build import build_model
from ..models.config import ModelConfig
from .config import TrainConfig

__all__ = ["FORMAT", "VERSION", "Checkpoint", "CheckpointError", "load_checkpoint", "umask_mode", "write_checkpoint"]

FORMAT = "attnlab-checkpoint"
VERSION = 2
READABLE = (1, 2)


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, truncated, or not written by attnlab."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: its configs, the model with the chosen weights, and the training state."""

    path: Path
    config: TrainConfig
    model_config: ModelConfig
    model: nn.Module
    meta: dict
    state: dict | None

    @property
    def context(self) -> int | None:
        """The longest sequence the model was trained on (its positions hold one more: a summary
        token), or None for a model without positions."""
        max_len = getattr(self.model_config, "max_len", None)
        return int(max_len) - 1 if max_len else None


def _unshared(state: dict) -> dict:
    """The tensors of a state dict, contiguous, each with its own memory: safetensors refuses
    tensors that share it (a positional table shared by every layer, as ``relative`` is); each
    copy is loaded back into the one shared parameter."""
    seen: set = set()
    out = {}
    for k, v in state.items():
        v = v.detach().cpu().contiguous()  # a checkpoint written on any device loads on any other
        ptr = (v.untyped_storage().data_ptr(), v.storage_offset()) if v.numel() else None
        if ptr is not None and ptr in seen:
            v = v.clone()
        seen.add(ptr)
        out[k] = v
    return out


def write_checkpoint(out: Path, model: nn.Module, best_state: dict, cfg: TrainConfig, mcfg: ModelConfig, meta: dict,
                     state: dict) -> Path:
    """Write ``out/checkpoint`` atomically (see the module docstring) and return its path."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    final, old = out / "checkpoint", out / "checkpoint.old"
    tmp = out / f"checkpoint.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file(_unshared(model.state_dict()), str(tmp / "model.safetensors"))
    save_file(_unshared(best_state), str(tmp / "best.safetensors"))
    torch.save(state, tmp / "state.pt")
    payload = {"format": FORMAT, "version": VERSION, "train": dataclasses.asdict(cfg), "model": mcfg.to_dict(), **meta}
    (tmp / "config.json").write_text(json.dumps(payload, indent=1))
    mode = umask_mode()
    for f in tmp.iterdir():
        os.chmod(f, mode)  # safetensors writes 0600, the rest follows the umask: one mode for every file
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)
    _remove_stale(out)
    return final


def umask_mode() -> int:
    """The permissions of a new file under the user's umask (``0o644`` under the usual ``022``)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _remove_stale(out: Path) -> None:
    """Remove ``checkpoint.tmp-<pid>`` folders of processes that died mid-write (a SIGKILL)."""
    for tmp in out.glob("checkpoint.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:  # alive, another user's
            continue


def _resolve(path: str | Path) -> Path:
    p = Path(path)
    for cand in (p / "checkpoint", p, p / "checkpoint.old"):
        if (cand / "config.json").exists():
            return cand
    if not p.exists():
        raise CheckpointError(f"no checkpoint at {p}")
    raise CheckpointError(f"{p} is not an attnlab checkpoint folder (no config.json; expected the --out folder of "
                          "'attnlab train')")


def load_checkpoint(path: str | Path, *, weights: str = "best", with_state: bool = False, device=None) -> Checkpoint:
    """Load a checkpoint folder (or the ``--out`` folder that holds it).

    Args:
        weights: ``"best"`` (best validation score) or ``"last"``.
        with_state: also load the optimizer / RNG state (for resuming; its tensors on the CPU).
        device: the device the model goes to (:func:`attnlab.devices.resolve`; None: the CPU),
            whichever device wrote the checkpoint.

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
    if meta.get("version") not in READABLE:
        raise CheckpointError(f"{folder} has checkpoint version {meta.get('version')}, this attnlab reads version "
                              f"{VERSION}")
    try:
        cfg = TrainConfig.from_dict(meta["train"])
        mcfg = ModelConfig.from_dict(meta["model"])
        model = build_model(mcfg)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{folder}: config.json does not describe a model attnlab can build ({e})") from None
    name = "best.safetensors" if weights == "best" else "model.safetensors"
    try:
        tensors = load_file(str(folder / name))
    except (OSError, SafetensorError, RuntimeError) as e:
        raise CheckpointError(f"{folder / name} is truncated or corrupt: {e}") from None
    # written before a layer's migration (its load hook maps the keys)
    renamed = set(tensors) != set(model.state_dict())
    _load_weights(model, tensors, folder / name)
    state = None
    if with_state:
        try:
            state = torch.load(folder / "state.pt", weights_only=True, map_location="cpu")
        except Exception as e:
            raise CheckpointError(f"{folder / 'state.pt'} is truncated or corrupt: {e}") from None
        if renamed:  # the optimizer's state follows the parameters in the order the model of then listed them
            then = parameters_with_step(model) if _with_step(tensors, model) else parameters_before_step(model)
            state["optimizer"] = _reordered(state["optimizer"], then, [k for k, _ in model.named_parameters()])
        _check_optimizer(state["optimizer"], model, folder / "state.pt")
    if device is not None:
        model.to(resolve_device(device))
    return Checkpoint(folder, cfg, mcfg, model, {k: v for k, v in meta.items() if k not in ("train", "model")}, state)


def _with_step(tensors: dict, model: nn.Module) -> bool:
    """Whether ``tensors`` were written when a layer held a sequence mixer's parameters as its ``step``."""
    mixers = [f"{name}." for name, m in model.named_modules() if isinstance(m, SequenceMixer)]
    return any(key.startswith(f"{p}step.") for key in tensors for p in mixers)


def _load_weights(model: nn.Module, tensors: dict, file: Path) -> None:
    """Load ``tensors`` into ``model`` through its load hooks (which map the keys of layers written
    before, :func:`attnlab.layers.migration.step_keys`), then refuse what is still missing, left
    over or of another shape, naming a few of each."""
    try:
        result = model.load_state_dict(tensors, strict=False)
    except RuntimeError as e:  # shapes (the keys' check is below): torch names each tensor
        found = _SIZE.findall(str(e))
        shapes = [f"{k} ({a}) in the file, ({b}) in the model" for k, a, b in found] or [str(e).strip()]
        raise CheckpointError(f"{file} does not hold the weights of the model its config.json describes: "
                              f"{_few(shapes, 'tensor', 'of another shape')}") from None
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if missing or unexpected:
        said = [_few(missing, "tensor", "of the model missing")] if missing else []
        said += [_few(unexpected, "tensor", "the model does not have")] if unexpected else []
        raise CheckpointError(f"{file} does not hold the weights of the model its config.json describes: "
                              f"{'; '.join(said)}")


_SIZE = re.compile(r"size mismatch for ([^:]+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) from "
                   r"checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)")


def _few(items: list[str], noun: str, what: str, shown: int = 3) -> str:
    """``"2 tensors of the model missing: a, b"`` (at most ``shown`` named, then how many more)."""
    named = ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")
    return f"{len(items)} {noun}{'s' if len(items) != 1 else ''} {what}: {named}"


def _reordered(optimizer: dict, old: list[str], new: list[str]) -> dict:
    """An optimizer's state dict over parameters listed in the order ``old`` (their names), re-keyed
    for the order ``new`` of the same parameters."""
    if sorted(old) != sorted(new):
        return optimizer  # not the same parameters: the check of the state refuses it
    where = {n: i for i, n in enumerate(new)}
    index = [where[n] for n in old]
    state = {index[i]: s for i, s in optimizer["state"].items()}
    groups = [{**g, "params": sorted(index[i] for i in g["params"])} for g in optimizer["param_groups"]]
    return {**optimizer, "state": state, "param_groups": groups}


def _check_optimizer(optimizer: dict, model: nn.Module, file: Path) -> None:
    """Refuse an optimizer state that does not hold one entry per parameter of ``model``, each of its shape."""
    params = list(model.parameters())
    ids = [i for g in optimizer.get("param_groups", []) for i in g.get("params", [])]
    wrong = [] if len(ids) == len(params) else [f"{len(ids)} parameters in the file, {len(params)} in the model"]
    for i, p in zip(ids, params):
        for k, v in optimizer.get("state", {}).get(i, {}).items():
            if isinstance(v, torch.Tensor) and v.dim() and v.shape != p.shape:
                wrong.append(f"{k} of parameter {i}: {tuple(v.shape)}, the parameter {tuple(p.shape)}")
    if wrong:
        raise CheckpointError(f"{file}: the optimizer's state does not match the model's parameters "
                              f"({'; '.join(wrong[:3])})")
