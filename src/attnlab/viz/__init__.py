"""Pictures: benchmark charts (attention maps and positional encodings come with later issues)."""

from .bench import plot_attention_benchmark

__all__ = ["plot_attention_benchmark"]
