"""Built-in tasks, generated here from a fixed seed (see :mod:`attnlab.tasks.base`).

* ``pos`` — tagging with ambiguous words (:mod:`attnlab.tasks.pos`);
* ``recall`` — multi-query associative recall (:mod:`attnlab.tasks.recall`);
* ``lookup`` — a key-value log read part-way, 1K-4K tokens: attention must find the past writes
  (:mod:`attnlab.tasks.lookup`);
* ``listops`` — nested list operations, classification (:mod:`attnlab.tasks.listops`);
* ``translate`` — sequence to sequence with reordering (:mod:`attnlab.tasks.translate`);
* ``karate``, ``sbm``, ``molecules`` — graphs: node and molecule labels (:mod:`attnlab.tasks.graphs`);
* ``digits`` — images: 8x8 handwritten digits (:mod:`attnlab.tasks.images`);
* ``speech``, ``wav_folder`` — audio: spoken words as frames (:mod:`attnlab.tasks.speech`);
* ``text``, ``retrieval``, ``pathfinder`` — long sequences (1K-4K tokens) after the Long Range
  Arena: byte-level standard-library source by package, pairs of it, dashed-curve images
  (:mod:`attnlab.tasks.text`, :mod:`attnlab.tasks.retrieval`, :mod:`attnlab.tasks.pathfinder`);
* ``docs`` — byte-level language modelling of Python's documentation (:mod:`attnlab.tasks.docs`);
* ``jsonl`` — the user's own file, any of the three kinds (:mod:`attnlab.tasks.jsonl`).
"""

from . import (  # noqa: F401  (registration)
    docs,
    graphs,
    images,
    jsonl,
    listops,
    lookup,
    pathfinder,
    pos,
    recall,
    retrieval,
    speech,
    text,
    translate,
)
from .base import (
    CLS,
    FIRST,
    IGNORE,
    INPUTS,
    KINDS,
    PAD,
    TASKS,
    DataChangedError,
    Split,
    Task,
    baseline_model,
    check_saved,
    create,
    data_digest,
    data_files,
    names,
    register,
    train_defaults,
)

__all__ = ["Task", "Split", "create", "names", "register", "train_defaults", "baseline_model", "TASKS", "PAD", "CLS",
           "FIRST", "IGNORE", "KINDS", "INPUTS", "DataChangedError", "check_saved", "data_digest", "data_files"]
