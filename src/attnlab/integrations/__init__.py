"""attnlab inside other libraries' models.

* :mod:`attnlab.integrations.transformers`: an attention backend for Hugging Face
  ``transformers`` (``attn_implementation="attnlab"`` or ``"attnlab:<variant>"``), registered
  when the module is imported (the ``attnlab[transformers]`` extra); :mod:`~attnlab.integrations.masking` holds its
  mask interface.
* :mod:`attnlab.integrations.hybrid`: the linear-attention layers of transformers' hybrid models on attnlab's
  recurrences (:func:`~attnlab.integrations.hybrid.use_kernels`); its module docstring names the siblings that hold
  the served functions, the layers' method copies and the model's hooks.

Nothing inside attnlab imports this package: an integration is imported by its user.
"""
