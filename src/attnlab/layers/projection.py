"""What both kinds of layer (:class:`attnlab.MultiHeadAttention`, :class:`attnlab.layers.mixer.SequenceMixer`) do
around their method: draw their projections, check the input, project it to the heads in one product, and merge the
heads' outputs through ``W^o``."""

from __future__ import annotations

import torch
from torch import nn

from ..validate import ArgumentTypeError

__all__ = ["check_input", "fused_weights", "init_projections", "merge_heads"]


def init_projections(*linears: nn.Linear) -> None:
    """Xavier-uniform weights and zero biases, as ``torch.nn.MultiheadAttention`` draws its projections (in the order
    given: a seeded layer's weights depend on it)."""
    for lin in linears:
        nn.init.xavier_uniform_(lin.weight)
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)


def merge_heads(layer, out: torch.Tensor) -> torch.Tensor:
    """``W^o concat(heads)``: ``(B, H, N, D)`` -> ``(B, N, E)``, through ``layer.out_proj``."""
    b, _, n, _ = out.shape
    return layer.out_proj(out.transpose(1, 2).reshape(b, n, layer.embed_dim))


def check_input(self, name: str, x, width: int, batch: int | None) -> None:
    """``self``: the layer. Refuse an input that is not a ``(B, N, width)`` tensor of this layer's dtype (``batch``: B,
    when known)."""
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor of shape (B, N, {width}), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have rank 3, shape (B, N, {width}); got shape {tuple(x.shape)}")
    if x.shape[-1] != width:
        raise ValueError(f"{name} must have last dimension {width}, got shape {tuple(x.shape)}")
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"{name} has batch size {x.shape[0]}, but query has {batch}")
    w = getattr(self.q_proj, "weight", None)  # the layer's dtype (autocast computes in its own: any input then)
    if (isinstance(w, torch.Tensor) and w.is_floating_point() and x.dtype != w.dtype
            and not torch.is_autocast_enabled(x.device.type)):
        fix = f", or the layer to the input's: layer.to({x.dtype})" + (
            " (layer.double())" if x.dtype == torch.float64 else "")
        raise ArgumentTypeError(f"{name} has dtype {x.dtype}, but this layer computes in {w.dtype}: convert the input, "
                                f"{name}.to({w.dtype})" + (
                                    fix if x.is_floating_point() else " (attention takes float vectors)"))


def fused_weights(layer, projs: list) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[W^q; W^k; W^v]`` ((3E, E), (E + 2 G D, E) grouped, or (2E, E) without keys) and its
    bias. Without gradients (inference, decoding) it is kept while the weights are unchanged
    (same storage, same version), so a decoding step does not copy the weights again. Writes
    through ``.data`` bypass the version counter: write to the parameters themselves (under
    ``torch.no_grad()``), as optimisers and ``load_state_dict`` do."""
    tensors = [t for p in projs for t in (p.weight, p.bias) if t is not None]
    key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
    memo = layer.__dict__.get("_fused_memo")
    if torch.is_grad_enabled():
        layer.__dict__.pop("_fused_memo", None)  # training: nothing kept (the weights change at every step)
    elif memo is not None and memo[0] == key:
        return memo[1], memo[2]
    w = torch.cat([p.weight for p in projs])
    bias = None if projs[0].bias is None else torch.cat([p.bias for p in projs])
    # the detached views keep the storages alive: no new tensor can reuse their addresses
    if not torch.is_grad_enabled():
        layer.__dict__["_fused_memo"] = (key, w, bias, [t.detach() for t in tensors])
    return w, bias
