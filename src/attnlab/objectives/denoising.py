"""Self-pretraining: a denoising objective on a task's own inputs, no labels (Amos, Berant &
Gupta, ICLR 2024, "Never Train from Scratch": masked or causal denoising on the task's inputs,
then fine-tuning, lifts Transformers on every Long Range Arena task).

* A **bidirectional** backbone learns to restore corrupted tokens (BERT's recipe): about
  :data:`MASK_RATE` of each sequence's real tokens (at least one) are chosen; of those 80 % become
  :data:`MASK`, 10 % a random token of the vocabulary, 10 % stay; the loss is the cross-entropy of
  the original token at the chosen positions.
* A **causal** backbone (``lm``, ``mlp``, a ``transformer`` with ``--causal``) learns the next token
  at every real position, as a language model does.

The output layer is the backbone's own input embedding (:func:`attnlab.models.lm.tied_logits`)
plus a bias, so every token backbone (any attention variant, positional encoding, or none) is
pretrained the same way, and nothing but the bias is added; the task's head is untouched.
:func:`attnlab.training.train` runs this phase first when ``TrainConfig.pretrain_steps`` > 0.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.base import CLS, FIRST, IGNORE, PAD, Backbone, ModelOutput
from ..models.lm import tied_logits
from ..tasks.base import Task
from .base import Objective, batches, model_device

__all__ = ["MASK", "MASK_RATE", "Denoising", "DenoisingModel", "token_backbone"]

MASK = CLS
"""The id that replaces a masked token: the summary token's id, which no task's own sequence
holds (task tokens start at ``FIRST``); under ``pooling="cls"`` fine-tuning puts it in front of
every sequence, where its output then summarises the context, as a masked position's did."""

MASK_RATE = 0.15
"""The share of a sequence's real tokens a bidirectional backbone learns to restore."""


def token_backbone(model: nn.Module) -> Backbone:
    """The backbone over tokens inside a task's model (``model.backbone``; a seq2seq model's
    ``encoder``); ``ValueError`` for models that read vectors, images or graphs."""
    backbone = getattr(model, "backbone", None) or getattr(model, "encoder", None)
    if not isinstance(backbone, Backbone) or getattr(backbone, "inputs", "tokens") != "tokens":
        raise ValueError(f"self-pretraining restores tokens: {type(model).__name__} reads "
                         f"{getattr(backbone, 'inputs', 'no tokens')}, so it has no token vocabulary to denoise")
    return backbone


class DenoisingModel(nn.Module):
    """A token backbone with the tied output layer of self-pretraining: tokens ``(B, N)`` ->
    logits ``(B, N, V)``. ``causal``: the backbone's own (next-token prediction when True)."""

    def __init__(self, backbone: Backbone):
        super().__init__()
        self.backbone = backbone
        self.causal = bool(getattr(backbone, "causal", False))
        self.bias = nn.Parameter(torch.zeros(backbone.embed.num_embeddings, device=backbone.embed.weight.device))

    @property
    def vocab_size(self) -> int:
        """Token ids ``0 .. vocab_size - 1``."""
        return self.backbone.embed.num_embeddings

    def forward(self, tokens: torch.Tensor) -> ModelOutput:
        """Logits ``(B, N, V)`` of the token at (bidirectional) or after (causal) each position."""
        return ModelOutput(tied_logits(self.backbone(tokens, tokens == PAD).output, self.backbone.embed, self.bias))


class Denoising(Objective):
    """The loss and metric of self-pretraining over a :class:`DenoisingModel`.

    Args:
        rate: the share of real tokens a bidirectional backbone restores.
    """

    name = "denoising"

    def __init__(self, rate: float = MASK_RATE):
        if not 0 < rate <= 1:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        self.rate = rate

    def corrupt(self, tokens: torch.Tensor, vocab_size: int, causal: bool,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, labels)`` of token rows ``(B, N)``: causal, the tokens and the next token at
        each real position (``IGNORE`` at the last and at padding); bidirectional, the corrupted
        tokens and the original token at each chosen position (``IGNORE`` elsewhere)."""
        real = tokens != PAD
        if causal:
            nxt = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], PAD)], dim=1)
            return tokens, nxt.masked_fill(nxt == PAD, IGNORE)
        draw = torch.rand(tokens.shape, generator=generator, device="cpu").to(tokens.device)
        chosen = (draw < self.rate) & real
        first = draw.masked_fill(~real, 2.0).argmin(-1, keepdim=True)  # every row with a token restores one at least
        chosen.scatter_(-1, first, real.gather(-1, first) | chosen.gather(-1, first))
        how = torch.rand(tokens.shape, generator=generator, device="cpu").to(tokens.device)
        noise = torch.randint(FIRST, max(vocab_size, FIRST + 1), tokens.shape, generator=generator,
                              device="cpu").to(tokens.device)
        inputs = torch.where(chosen & (how < 0.8), MASK, tokens)
        inputs = torch.where(chosen & (how >= 0.8) & (how < 0.9), noise, inputs)
        return inputs, tokens.masked_fill(~chosen, IGNORE)

    def loss(self, model: DenoisingModel, inputs: dict, labels: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean cross-entropy of the restored (or next) tokens of a batch's ``inputs["tokens"]``
        (``(B, N)``, or pairs ``(B, 2, N)``: each sequence alone); the task's labels are unused."""
        x, target = self.corrupt(_rows(inputs["tokens"]), model.vocab_size, model.causal, generator)
        logits = model(x).output
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORE)

    @torch.no_grad()
    def score(self, model: DenoisingModel, task: Task, split: str, batch_size: int | None = None) -> float:
        """Accuracy of the restored (or next) tokens over a split (a fixed corruption, seed 0)."""
        model.eval()
        gen = torch.Generator().manual_seed(0)
        right = total = 0
        for inputs, _ in batches(self, task, task.split(split), batch_size, device=model_device(model)):
            x, target = self.corrupt(_rows(inputs["tokens"]), model.vocab_size, model.causal, gen)
            scored = target != IGNORE
            right += int((model(x).output.argmax(-1) == target)[scored].sum())
            total += int(scored.sum())
        return right / max(total, 1)


def _rows(tokens: torch.Tensor) -> torch.Tensor:
    """Token sequences as rows ``(B, N)``: pairs ``(B, 2, N)`` become ``2B`` rows."""
    return tokens.flatten(0, 1) if tokens.dim() == 3 else tokens
