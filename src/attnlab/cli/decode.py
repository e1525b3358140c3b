"""``attnlab bench decode``: cached against uncached decoding and against Hugging Face ``generate``,
the memory of a bounded cache over long streams, and (with a trained checkpoint) the perplexity
of StreamingLLM's sinks + window cache on a stream longer than the training context.
``attnlab bench packing``: the cost per token of packed documents."""

from __future__ import annotations

import typer

from .common import emit_json, int_list, out, records_json, track
from .errors import device_or_fail, fail, usage_error
from .measured import measured
from .options import blocks_option, device_option, heads_option, json_option, output_option, width_option
from .tables import fmt_x, on_device, table

__all__ = ["bench_decode", "bench_packing"]


def _bench_decode(
    *,
    contexts: str = typer.Option("256,1024,4096", help="Comma-separated prompt lengths."),
    new_tokens: int = typer.Option(32, "--new-tokens", min=2, help="Greedy tokens decoded after each prompt."),
    embed_dim: int = width_option(256),
    num_layers: int = blocks_option(4),
    num_heads: int = heads_option(4),
    uncached_up_to: int | None = typer.Option(None, "--uncached-up-to", min=1,
                                              help="Longest context of the uncached reference (default: all)."),
    stream_lengths: str = typer.Option("1000,10000,100000", "--stream-lengths",
                                       help="Stream lengths of the cache-memory measure ('' skips it)."),
    checkpoint: str | None = typer.Option(
        None, help="A docs language model (attnlab train docs): also measure streaming perplexity."),
    factor: int = typer.Option(8, min=2, help="The perplexity stream is this many training contexts long."),
    streams: int = typer.Option(2, min=1, help="Streams of the perplexity measure (cut from the docs test text)."),
    device: str = device_option(),
    output: str | None = None,
) -> dict:
    """Decoding speed and memory: KV cache vs recomputation vs transformers' generate, side by side."""
    where = device_or_fail(device)
    return _measure(contexts, new_tokens=new_tokens, embed_dim=embed_dim, num_layers=num_layers, num_heads=num_heads,
                    uncached_up_to=uncached_up_to, stream_lengths=stream_lengths, checkpoint=checkpoint, factor=factor,
                    streams=streams, output=output, device=where)


def _measure(contexts, *, new_tokens, embed_dim, num_layers, num_heads, uncached_up_to, stream_lengths, checkpoint,
             factor, streams, output, device) -> dict:
    from ..studies import decode

    cs = int_list("--contexts", contexts, minimum=1)
    lengths = int_list("--stream-lengths", stream_lengths, minimum=1) if stream_lengths.strip() else []
    if embed_dim % num_heads:
        usage_error(f"--embed-dim {embed_dim} must be divisible by --num-heads {num_heads}")
    model = text = context = None
    if checkpoint:
        from ..tasks import create as make_task
        from ..training import CheckpointError, load_checkpoint

        try:
            ck = load_checkpoint(checkpoint, device=device)
        except CheckpointError as e:
            fail(e)
        if ck.model_config.kind != "lm" or ck.config.task != "docs":
            fail(f"--checkpoint {checkpoint}: streaming perplexity needs a model trained on the docs task "
                 "(attnlab train docs)")
        task = make_task("docs", **ck.config.task_options)
        model, context = ck.model, task.max_len
        text = task.split("test").tokens.reshape(-1)  # the test windows do not overlap: the test text in order
    data: dict = {"speed": [], "memory": [], "perplexity": []}
    total = len(cs) + (1 if lengths else 0) + (4 if checkpoint else 0)
    with track("decoding", total, output, lambda recs: data) as tracker:
        def keep(kind, advance=1):  # advance: a number, or record -> number
            def cb(rec):
                data[kind].append(rec.to_dict())
                tracker.update(int(advance(rec)) if callable(advance) else advance, f"{kind}: {_describe(rec)}")
                tracker.save()
            return cb

        try:
            decode.speed(cs, new_tokens=new_tokens, embed_dim=embed_dim, num_layers=num_layers, num_heads=num_heads,
                         uncached_up_to=uncached_up_to, device=device,
                         # one step per context
                         on_record=keep("speed", lambda r: r.implementation == "attnlab cached"))
            if lengths:
                decode.streaming_memory(lengths, device=device, on_record=keep("memory", 0))
                tracker.update(1)
            if checkpoint:
                decode.streaming_perplexity(model, text, context=context, factor=factor, streams=streams,
                                            on_record=keep("perplexity"))
        except ValueError as e:
            fail(e)
    return data


def _describe(rec) -> str:
    d = rec.to_dict()
    return " ".join(str(d[k]) for k in ("implementation", "context", "cache", "tokens", "method") if k in d)


def _checked(data: dict) -> dict:
    if not isinstance(data, dict) or not {"speed", "memory", "perplexity"} <= set(data):
        raise KeyError("speed, memory and perplexity")
    for r in data["speed"]:
        for f in ("implementation", "context", "new_tokens", "tokens_per_second", "decode_tokens_per_second",
                  "prefill_seconds"):
            if f not in r:
                raise KeyError(f)
    return data


def _report(data: dict) -> None:
    speed = data["speed"]
    if speed:
        r0 = speed[0]
        t = table(f"greedy decoding of {r0['new_tokens']} tokens, d={r0['dim']}, {r0['layers']} layers, "
                  f"{r0['heads']} heads, vocabulary {r0['vocab']}, one sequence (side by side, median of "
                  f"{r0['repeats']})",
                  ["context", "implementation", "prompt s", "tokens/s (end to end)", "tokens/s (decoding)",
                   "vs uncached", "vs transformers", "same tokens"], left=["implementation"])
        for c in dict.fromkeys(r["context"] for r in speed):
            rows = {r["implementation"]: r for r in speed if r["context"] == c}
            unc, hf = rows.get("attnlab uncached"), rows.get("transformers generate")
            for impl, r in rows.items():
                rate = r["decode_tokens_per_second"]
                vs_unc = (None if unc is None or not rate or not unc["decode_tokens_per_second"]
                          else rate / unc["decode_tokens_per_second"])
                vs_hf = (None if hf is None or not rate or not hf["decode_tokens_per_second"]
                         else rate / hf["decode_tokens_per_second"])
                same = {True: "yes", False: "NO", None: "-"}[r["same_tokens"]]
                t.add_row(str(c), impl, f"{r['prefill_seconds']:.3f}", f"{r['tokens_per_second']:.1f}",
                          "-" if not rate else f"{rate:.1f}", fmt_x(vs_unc), fmt_x(vs_hf), same)
        out.print(t)
    if data["memory"]:
        t = table("cache memory over a stream (rope model, d=64, 2 layers)", ["cache", "tokens", "bytes"])
        for r in data["memory"]:
            t.add_row(r["cache"] + ("" if r["window"] is None else f" ({r['sinks']} + {r['window']})"),
                      f"{r['tokens']:,}", f"{r['cache_bytes']:,}")
        out.print(t)
    if data["perplexity"]:
        r0 = data["perplexity"][0]
        t = table(f"perplexity per byte on {r0['streams']} streams of {r0['stream']} bytes of the docs test text "
                  f"({r0['stream'] // r0['context']}x the training context {r0['context']})",
                  ["method", "tokens attended", "perplexity"])
        for r in data["perplexity"]:
            t.add_row(r["method"], "all" if r["kept"] is None else str(r["kept"]), f"{r['perplexity']:.3f}")
        out.print(t)


bench_decode = measured(
    "bench decode", draw="decode.plot_decode", show=_report, checked=_checked,
    plot_help="Also draw tokens per second against the context (and cache memory) to this PNG.")(_bench_decode)


def bench_packing(
    counts: str = typer.Option("1,4,16,64", help="Comma-separated numbers of documents packed into one row."),
    min_length: int = typer.Option(64, "--min-length", min=1, help="Shortest document."),
    max_length: int = typer.Option(256, "--max-length", min=1, help="Longest document."),
    embed_dim: int = width_option(128),
    num_layers: int = blocks_option(2),
    dense_up_to: int = typer.Option(
        8192, "--dense-up-to", min=1, help="Longest packed row the dense T x T mask is run at."),
    as_json: bool = json_option("Print the records as JSON instead of a table."),
    output: str | None = output_option("Also write the JSON here (after every record)."),
    device: str = device_option(),
) -> None:
    """Packed documents: cost per token of forward + backward, document by document vs dense mask vs padding."""
    where = device_or_fail(device)
    from ..studies import packing

    ks = int_list("--counts", counts, minimum=1)
    if min_length > max_length:
        usage_error(f"--min-length {min_length} exceeds --max-length {max_length}")
    with track("packing", len(ks) * 3, output, records_json) as tracker:
        packing.run(ks, min_length=min_length, max_length=max_length, embed_dim=embed_dim, num_layers=num_layers,
                    dense_up_to=dense_up_to, device=where,
                    on_record=tracker.on_record(lambda r: f"{r.documents} documents: {r.method}"))
    recs = [r.to_dict() for r in tracker.records]
    if emit_json({"records": recs}, as_json):
        return
    r0 = recs[0]
    t = table(f"causal encoder d={r0['dim']}, {r0['layers']} layers, forward + backward{on_device(where)}; "
              f"documents of {min_length}-{max_length} tokens",
              ["documents", "tokens", "method", "seconds", "us per token"], left=["method"])
    for r in recs:
        t.add_row(str(r["documents"]), f"{r['tokens']:,}", r["method"], f"{r['seconds']:.3f}",
                  f"{r['microseconds_per_token']:.1f}")
    out.print(t)
