"""Pretrained transformers (the BERT family) loaded into attnlab's own modules.

``load("all-MiniLM-L6-v2")`` (the weights ship in the ``attnlab[pretrained]`` extra) or
``load("path/to/folder")`` (any folder in the Hugging Face layout) returns a
:class:`Pretrained`: tokenizer, :class:`BertModel` built from :class:`attnlab.Encoder` blocks,
and sentence-transformers' pooling. ``attention=`` swaps every block's softmax attention for
any variant of :mod:`attnlab.efficient`, keeping the trained weights. No ``transformers`` at
run time: the folder is read with ``safetensors`` (or ``torch.load``) and ``tokenizers``.
"""

from .bert import BertConfig, BertEmbeddings, BertModel, PretrainedError, load_weights, read_tensors
from .model import MODELS, Encoded, Pretrained, TextTooLongError, available, load, locate

__all__ = [
    "BertConfig",
    "BertEmbeddings",
    "BertModel",
    "Encoded",
    "MODELS",
    "Pretrained",
    "TextTooLongError",
    "PretrainedError",
    "available",
    "load",
    "load_weights",
    "locate",
    "read_tensors",
]
