"""``attnlab explain``: self-attention on a sentence, step by step."""

from __future__ import annotations

import typer

from ..core.normalize import NORMALIZERS
from ..core.scores import SCORES
from .common import out, print_json, require_text
from .errors import fail
from .options import json_option, one_of
from .tables import matrix

__all__ = ["Normalizer", "Score", "explain"]

Score = one_of(SCORES.names())
"""``--score``: a registered score function (``attnlab list scores``)."""

Normalizer = one_of(NORMALIZERS.names())
"""``--normalize``: a registered normaliser (``attnlab list normalizers``)."""


def explain(
    sentence: str = typer.Argument("I saw a saw", help="The sentence; tokens are split on whitespace."),
    score: Score = typer.Option("scaled_dot", help="Score function."),
    normalize: Normalizer = typer.Option("softmax", help="Normaliser of each row of scores."),
    no_self: bool = typer.Option(False, "--no-self", help="Forbid each token to attend to itself."),
    num_heads: int = typer.Option(1, "--num-heads", help="Number of heads (must divide --embed-dim)."),
    embed_dim: int = typer.Option(4, "--embed-dim", help="Embedding width d."),
    seed: int = typer.Option(0, help="Seed of the embeddings and projection matrices."),
    as_json: bool = json_option("Print every step as JSON instead of tables."),
) -> None:
    """Compute self-attention on a sentence and print every step: I, Q, K, V, A, A', O."""
    from ..explain import explain as run_explain

    require_text(sentence)
    try:
        ex = run_explain(sentence, score=score, normalize=normalize, no_self=no_self, num_heads=num_heads,
                         embed_dim=embed_dim, seed=seed)
    except ValueError as e:
        fail(e)
    if as_json:
        print_json(ex.to_dict())
        return
    labels = [f"{i}:{t}" for i, t in enumerate(ex.tokens)]
    dims = [f"d{c}" for c in range(embed_dim)]
    out.print(
        f"[bold]Self-attention on {ex.tokens}[/] — score [cyan]{score}[/], normaliser [cyan]{normalize}[/], "
        f"{num_heads} head(s){', no attention to self' if no_self else ''}; float64 reference steps.\n"
        "Rows are tokens. Identical tokens get identical embeddings: without positions they get identical outputs.\n"
    )
    out.print(matrix("I — input vectors a^i", ex.inputs, labels, dims))
    hd = [f"d{c}" for c in range(embed_dim // num_heads)]
    for h in range(num_heads):
        tag = f" (head {h + 1})" if num_heads > 1 else ""
        out.print()
        out.print(matrix(f"Q = W^q I{tag}", ex.q[h], labels, hd))
        out.print(matrix(f"K = W^k I{tag}", ex.k[h], labels, hd))
        out.print(matrix(f"V = W^v I{tag}", ex.v[h], labels, hd))
        out.print(matrix(f"A — scores alpha_ij = {score}(q^i, k^j){tag}; · = masked", ex.scores[h], labels, labels))
        out.print(matrix(f"A' — {normalize} of each row{tag}", ex.weights[h], labels, labels))
        out.print(matrix(f"O = A' V{tag}", ex.head_outputs[h], labels, hd))
    if num_heads > 1:
        out.print()
        out.print(matrix("output = concat(O^1..O^h) W^o", ex.output, labels, dims))
