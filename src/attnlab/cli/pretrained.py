"""``attnlab attention``, ``attnlab view`` and ``attnlab bench pretrained``: real pretrained models."""

from __future__ import annotations

import typer

from .common import (
    chart,
    emit_json,
    err,
    int_list,
    load_report,
    name_list,
    out,
    print_json,
    records_json,
    refuse_overwrite,
    require_text,
    track,
)
from .errors import device_or_fail, exit_code, fail, usage_error
from .options import device_option, from_option, json_option, memory_option, output_option, plot_option
from .tables import fmt_x, table

__all__ = ["attention", "bench_pretrained", "view"]

MODEL_HELP = "A model name (all-MiniLM-L6-v2) or a Hugging Face-layout folder."


def _load(model: str, **options):
    from ..pretrained import load
    from ..validate import ArgumentTypeError

    try:
        return load(model, **options)
    except (ValueError, ArgumentTypeError, OSError) as e:  # PretrainedError is a ValueError
        fail(e)


def _cli_message(e: Exception) -> str:
    """An error in the command line's spelling (a too-long text names --truncate)."""
    from ..pretrained import TextTooLongError

    if isinstance(e, TextTooLongError):
        return (f"the text has {e.tokens} tokens, more than the model's {e.limit} positions: shorten it, or add "
                "--truncate to cut it")
    return str(e)


def attention(
    sentence: str = typer.Argument(..., help="The text (one sentence or a paragraph)."),
    model: str = typer.Option("all-MiniLM-L6-v2", "--model", help=MODEL_HELP),
    find: list[str] | None = typer.Option(
        None, "--find", help="Two words: SOURCE TARGET; name the heads that link them most.", show_default=False),
    top: int = typer.Option(5, min=1, help="With --find: the heads shown."),
    layer: int | None = typer.Option(None, min=1, help="Show only this layer (1-based)."),
    truncate: bool = typer.Option(
        False, "--truncate", help="Cut a text longer than the model's positions instead of refusing it."),
    as_json: bool = json_option("Print the tokens and every head's strongest links as JSON."),
) -> None:
    """Where each token attends in every layer and head of a pretrained model.

    Without --find: per layer, a table with a row per token and a column per head, each cell the
    token it attends to most and that weight. With --find SOURCE --find TARGET (or --find
    "SOURCE TARGET"): the heads with the largest SOURCE -> TARGET weight.
    """
    from ..pretrained.heads import attention_map, find_links

    require_text(sentence)
    words = [w for f in (find or []) for w in f.split()]
    if find is not None and len(words) != 2:
        usage_error(f"--find takes two words, SOURCE and TARGET (e.g. --find its --find law), got {words}")
    m = _load(model)
    try:
        amap = attention_map(m, sentence, truncate=truncate)
        links = find_links(amap, words[0], words[1], top) if words else None
    except ValueError as e:
        fail(_cli_message(e), exit_code(e))
    n_layers, n_heads = amap.weights.shape[:2]
    if layer is not None and layer > n_layers:
        usage_error(f"--layer must be in 1 .. {n_layers}, got {layer}")
    if as_json:
        data = {"model": model, "tokens": amap.tokens}
        if links is not None:
            data["links"] = [{"layer": x.layer + 1, "head": x.head + 1, "source": x.source, "target": x.target,
                              "weight": x.weight} for x in links]
        else:
            data["strongest"] = [[amap.strongest(li, h) for h in range(n_heads)] for li in range(n_layers)]
        print_json(data)
        return
    toks = amap.tokens
    if links is not None:
        t = table(f"{model}: the heads that link {words[0]!r} -> {words[1]!r} most ({n_layers} layers x "
                  f"{n_heads} heads)",
                  ["layer", "head", "from", "to", "weight"], left=["from", "to"])
        for x in links:
            t.add_row(str(x.layer + 1), str(x.head + 1), f"{x.source}:{toks[x.source]}", f"{x.target}:{toks[x.target]}",
                      f"{x.weight:.3f}")
        out.print(t)
        best = links[0]
        out.print(f"strongest: layer {best.layer + 1}, head {best.head + 1}: {toks[best.source]!r} gives "
                  f"{best.weight:.2f} of its attention to {toks[best.target]!r}")
        return
    for li in range(n_layers) if layer is None else [layer - 1]:
        t = table(f"layer {li + 1}: the token each token attends to most, per head, and its weight",
                  ["token", *(f"h{h + 1}" for h in range(n_heads))], no_wrap=True)
        strongest = [amap.strongest(li, h) for h in range(n_heads)]
        for i, tok in enumerate(toks):
            t.add_row(f"{i}:{tok[:10]}",
                      *(f"{toks[strongest[h][i][0]][:7]}\n{strongest[h][i][1]:.2f}" for h in range(n_heads)))
        out.print(t)


def view(
    text: str = typer.Argument(..., help="The text to show attention on."),
    out_path: str = typer.Option(
        "attention.html", "-o", "--out", help="The HTML file to write (an existing one only with --force)."),
    force: bool = typer.Option(False, "--force", help="Replace the file -o names if it exists."),
    model: str = typer.Option("all-MiniLM-L6-v2", "--model", help=MODEL_HELP),
    checkpoint: str | None = typer.Option(
        None, "--checkpoint", help="An attnlab checkpoint (a token model) instead of --model."),
    topk: int = typer.Option(32, min=1, help="Weights kept per token and head (the largest)."),
    truncate: bool = typer.Option(
        False, "--truncate", help="Cut a text longer than the model's positions instead of refusing it."),
    as_json: bool = json_option("Print one JSON object (path, bytes, tokens, layers, heads) instead of a sentence."),
) -> None:
    """Write an interactive attention viewer: one self-contained HTML file (no network).

    Model view (layers x heads), head view (lines from each token to what it attends to; hover
    or click tokens), attention rollout, and the step-by-step panel of `attnlab explain` for a
    chosen head and token.
    """
    from ..training.checkpoint import CheckpointError
    from ..viz.viewer import checkpoint_view, pretrained_view, write_viewer

    require_text(text)
    refuse_overwrite("-o", out_path, force)
    try:
        data = (checkpoint_view(checkpoint, text) if checkpoint
                else pretrained_view(_load(model), text, truncate=truncate))
        path = write_viewer(out_path, data, topk=topk)
    except (ValueError, CheckpointError, OSError) as e:
        fail(_cli_message(e), exit_code(e))
    n = len(data.tokens)
    layers, heads = data.weights.shape[:2]
    if as_json:
        print_json({"path": str(path), "bytes": path.stat().st_size, "tokens": list(data.tokens),
                    "layers": int(layers), "heads": int(heads)})
        return
    out.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {n} tokens, {layers} layers x {heads} heads; "
              "open it in a browser")


DECODER_HELP = ("A model: all-MiniLM-L6-v2, docs-llama (a decoder), or a Hugging Face-layout folder "
                "(encoder or LM).")


def bench_pretrained(
    model: str = typer.Option("all-MiniLM-L6-v2", "--model", help=DECODER_HELP),
    variants: str | None = typer.Option(
        None, help="Comma-separated attention variants (default: every one that takes the model's q, k and v).",
        show_default=False),
    lengths: str | None = typer.Option(
        None, help="Comma-separated sequence lengths (tokens) [default: 128,512; a decoder: 512].",
        show_default=False),
    pairs: int = typer.Option(200, min=2, help="An encoder: retrieval pairs (standard-library docstrings) per length."),
    windows: int = typer.Option(32, min=1, help="A decoder: held-out windows per length."),
    budgets: int = typer.Option(3, min=1, help="Budgets per variant (the largest of its sweep below N)."),
    memory: bool = memory_option(),
    as_json: bool = json_option("Print the records as JSON instead of a table."),
    output: str | None = output_option("Also write the JSON here (after every record)."),
    plot: str | None = plot_option("Also draw fidelity against speed to this PNG."),
    report: str | None = from_option("Measure nothing: print (and --plot) the JSON written by -o."),
    device: str = device_option(),
) -> None:
    """Swap every efficient attention into a trained model, no retraining: fidelity vs speed.

    An encoder (BERT family): for each variant and budget, the cosine of the documents' sentence
    embeddings to the trained model's, recall@1 of docstring first lines among their documents
    (and its change), one forward pass's time and memory and the attention step's time relative
    to the trained model. A decoder: perplexity on held-out text and one forward pass's time
    relative to the model under transformers' own sdpa (the exact 'attnlab' backend among the
    rows). Side by side in one run.
    """
    where = device_or_fail(device)
    from .. import efficient
    from ..studies.decoder import is_decoder
    from ..studies.pretrained import budgets_for, default_variants, run

    if report:
        recs = load_report(report, "bench pretrained", _checked_records)
        _pretrained_report(recs, plot, as_json)
        return
    if is_decoder(model):
        _bench_decoder(model, variants, lengths, windows=windows, budgets=budgets, as_json=as_json, output=output,
                       plot=plot, device=where)
        return
    names = name_list("--variants", variants or ",".join(default_variants()),
                      [v for v in efficient.names() if v != "dense"])
    ns = int_list("--lengths", lengths or "128,512", minimum=2)
    total = sum(1 + sum(len(budgets_for(v, n, budgets)) for v in names) for n in ns)
    with track("swapping attention", total, output, records_json) as tracker:
        tick = tracker.on_record(lambda r: f"N={r.n} {r.variant} {r.budget}")
        try:
            run(model, names, ns, pairs=pairs, memory=memory, max_points=budgets, on_record=tick, device=where)
        except ValueError as e:
            fail(e)
    _pretrained_report([r.to_dict() for r in tracker.records], plot, as_json)


def _bench_decoder(model, variants, lengths, *, windows, budgets, as_json, output, plot, device) -> None:
    from ..studies.decoder import TRAINING, decoder_variants, is_hybrid, run
    from ..studies.pretrained import budgets_for

    known = decoder_variants()
    names = name_list("--variants", variants or ",".join(known), known,
                      "a causal language model takes a variant with a causal form: " + ", ".join(known))
    ns = int_list("--lengths", lengths or "512", minimum=2)
    exact = 3 if is_hybrid(model) else 2  # sdpa, attnlab (and a hybrid's kernels)
    total = sum(exact + sum(len(budgets_for(v, n, budgets)) for v in names) for n in ns)
    with track("swapping attention into the decoder", total, output, records_json) as tracker:
        def trained(step, loss):  # a named decoder's first use: its training shows on the bar
            if step % 50 == 0:
                tracker.update(0, f"training {model} (first use, cached after): step {step}/{TRAINING['steps']}, "
                                  f"loss {loss:.3f}")

        try:
            run(model, names, ns, windows=windows, max_points=budgets, on_step=trained, device=device,
                on_record=tracker.on_record(lambda r: f"N={r.n} {r.variant} {r.budget}"))
        except (ValueError, OSError) as e:
            fail(e)
    _pretrained_report([r.to_dict() for r in tracker.records], plot, as_json)


FIELDS = ("model", "variant", "budget", "n", "documents", "batch", "cosine_mean", "cosine_min", "recall_at_1",
          "recall_delta", "seconds", "time_ratio", "memory_ratio", "step_ratio")
DECODER_FIELDS = ("model", "variant", "budget", "n", "windows", "batch", "perplexity", "ratio", "seconds", "time_ratio")


def _checked_records(data: dict) -> list[dict]:
    """The records of a ``bench pretrained -o`` file: every field there and a trained (dense) row per length."""
    recs = data["records"]
    decoder = bool(recs) and "perplexity" in recs[0]
    for r in recs:
        lacking = [f for f in (DECODER_FIELDS if decoder else FIELDS) if f not in r]
        if lacking:
            raise KeyError(f"a record lacks {', '.join(lacking)}")
    for n in {r["n"] for r in recs}:
        if not any(r["n"] == n and r["variant"] == ("sdpa" if decoder else "dense") for r in recs):
            raise ValueError(f"no trained-model ({'sdpa' if decoder else 'dense'}) record at N={n}")
    if not recs:
        raise ValueError("no records")
    return recs


def _pretrained_report(recs: list[dict], plot: str | None, as_json: bool) -> None:
    try:
        chart(plot, "pretrained.plot_pretrained", recs)
    except ValueError as e:
        usage_error(f"--plot: {e}")
    if emit_json({"records": recs}, as_json):
        return
    if "perplexity" in recs[0]:
        _decoder_table(recs)
        return
    for n in sorted({r["n"] for r in recs}):
        rows = [r for r in recs if r["n"] == n]
        base = next(r for r in rows if r["variant"] == "dense")
        t = table(
            f"{base['model']}, N = {n} tokens, {base['documents']} docstring pairs; trained model: recall@1 "
            f"{base['recall_at_1']:.3f}, {base['seconds'] * 1e3:.0f} ms per batch of {base['batch']}",
            ["variant", "budget", "cosine mean", "cosine min", "recall@1", "change", "time", "memory",
             "attention step"],
            left=["variant", "budget"],
        )
        for r in rows:
            t.add_row(r["variant"], r["budget"], f"{r['cosine_mean']:.3f}", f"{r['cosine_min']:.3f}",
                      f"{r['recall_at_1']:.3f}", f"{r['recall_delta']:+.3f}", fmt_x(r["time_ratio"]),
                      fmt_x(r["memory_ratio"]), fmt_x(r.get("step_ratio")))
        out.print(t)
        keep = [r for r in rows if r["variant"] != "dense" and r["cosine_mean"] > 0.95]
        err.print(f"N={n}: cosine > 0.95 without retraining: "
                  + (", ".join(f"{r['variant']} {r['budget']} ({fmt_x(r['time_ratio'])} time)" for r in keep)
                     or "none"))


def _decoder_table(recs: list[dict]) -> None:
    for n in sorted({r["n"] for r in recs}):
        rows = [r for r in recs if r["n"] == n]
        base = next(r for r in rows if r["variant"] == "sdpa")
        t = table(f"{base['model']}, N = {n} tokens, {base['windows']} held-out windows; trained model: perplexity "
                  f"{base['perplexity']:.3f}, {base['seconds'] * 1e3:.0f} ms per forward pass over "
                  f"{base['batch']} windows",
                  ["attention", "budget", "perplexity", "vs trained", "time"], left=["attention", "budget"])
        for r in rows:
            t.add_row(r["variant"], r["budget"], f"{r['perplexity']:.3f}", fmt_x(r["ratio"]), fmt_x(r["time_ratio"]))
        out.print(t)
        keep = [r for r in rows if r["variant"] not in ("sdpa", "attnlab") and r["ratio"] < 1.1]
        exact = next((r for r in rows if r["variant"] == "attnlab"), None)
        if exact is not None:
            err.print(f"N={n}: the exact attnlab backend takes {fmt_x(exact['time_ratio'])} sdpa's time, perplexity "
                      f"{exact['perplexity']:.4f}")
        err.print(f"N={n}: perplexity within 10% of the trained model without retraining: "
                  + (", ".join(f"{r['variant']} {r['budget']} ({fmt_x(r['time_ratio'])} time)" for r in keep)
                     or "none"))
