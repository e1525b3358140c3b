"""The measured comparisons users run (``attnlab bench ...``, ``attnlab compare ...``,
``attnlab complexity``): each study is a module with a runner that returns records.

=================  ==========================================================================
module             what it measures
=================  ==========================================================================
``attention``      ``attend`` against PyTorch's fused kernel and a naive implementation
``scaling``        every attention variant's time and memory against N (LRA's Table 2)
``peers``          the same variants in other libraries, side by side
``approximation``  each efficient variant's error against its budget
``positional``     positional encodings trained short, tested long (extrapolation)
``complexity``     time, sequential steps and path length of RNN / CNN / attention layers
``distance``       accuracy against the distance a dependency spans
``vit_cnn``        ViT against a CNN on the digits as the training set grows
``audio``          truncated against full attention on long audio
``graph``          sparse edge attention against PyG's TransformerConv
``pretrained``     efficient variants swapped into a trained BERT-family model
``decode``         cached decoding against recomputation and transformers' generate; streaming
``packing``        packed documents: cost per token, document by document vs dense mask vs padding
=================  ==========================================================================

What they measure with (peak memory, round-robin timing) is :mod:`attnlab.profiling`.
"""
