"""attnlab inside other libraries' models.

* :mod:`attnlab.integrations.transformers`: an attention backend for Hugging Face
  ``transformers`` (``attn_implementation="attnlab"`` or ``"attnlab:<variant>"``), registered
  when the module is imported (the ``attnlab[transformers]`` extra).

Nothing inside attnlab imports this package: an integration is imported by its user.
"""
