"""Benchmarks that attnlab can run on the user's machine (``attnlab bench ...``)."""

