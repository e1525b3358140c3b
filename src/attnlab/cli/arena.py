"""``attnlab arena | report``: train and compare attention variants across tasks, and their leaderboard."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from ..arena.presets import PRESETS
from .common import err, int_list, out, print_json, split_list
from .errors import device_or_fail, fail, usage_error
from .options import Precision, choices, device_option, json_option, one_of, plain, precision_option
from .tables import fmt_x, table

__all__ = ["Executor", "Preset", "arena", "report"]

Preset = one_of(PRESETS)
"""``--preset``: a grid of :data:`attnlab.arena.PRESETS`."""

Executor = choices("Executor", ("local", "ray"), "``arena --executor``: this machine's processes, or Ray tasks.")


def arena(
    tasks: str | None = typer.Option(None, help="Comma-separated tasks (default: the preset's)."),
    variants: str | None = typer.Option(None, help="Comma-separated attention variants (default: the preset's)."),
    preset: Preset = typer.Option("quick", help="The grid: quick (minutes), standard or lra (hours)."),
    seeds: str | None = typer.Option(None, help="Comma-separated seeds (default: each task's own)."),
    budget_steps: int | None = typer.Option(None, "--budget-steps", min=1,
                                            help="Every run trains this many optimizer steps (default: the preset's)."),
    budget_seconds: float | None = typer.Option(
        None, "--budget-seconds", min=1.0, help="Every run trains for these seconds instead: this machine's scores."),
    task_option: list[str] = typer.Option([], "--task-option", metavar="TASK.KEY=VALUE",
                                          help="A task option for one task of the grid, repeatable."),
    precision: Precision | None = precision_option(None),  # noqa: B008  (an enum is not immutable to ruff)
    device: str = device_option(),
    out_dir: str = typer.Option("arena", "--out", help="Folder of the store, the runs and the report."),
    data: str | None = typer.Option(None, "--data", help="Also run on your jsonl file (the task jsonl)."),
    sweep: list[str] = typer.Option(
        [], "--sweep", metavar="FIELD=V1,V2,...",
        help="Run every cell at each value of a training setting, repeatable."),
    workers: int | None = typer.Option(None, min=1, help="Runs at a time, each in its own process."),
    executor: Executor = typer.Option(Executor.local, "--executor",
                                      help="Where the runs run: this machine, or Ray tasks (attnlab[cluster])."),
    address: str | None = typer.Option(None, "--address", help="With --executor ray: the cluster to join (host:port)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run the stored failures again."),
    as_json: bool = json_option(
        "End by printing the leaderboard as one JSON object (tasks, average, report) instead of tables."),
) -> None:
    """Train and compare attention variants across tasks: resumable grid, SQLite store, leaderboard, report.html."""
    from rich.live import Live

    from ..arena import Store, plan, run_grid
    from ..arena.live import LiveGrid, run_name
    from ..arena.sweep import parse_sweep

    executor, precision = plain(executor), plain(precision)
    if data and not Path(data).is_file():
        fail(f"--data {data}: no such file (a jsonl file, see 'attnlab train jsonl')")
    if address is not None and executor != "ray":
        usage_error("--address is a Ray cluster's: it needs --executor ray")
    if address is not None and workers is not None and workers > 1:
        usage_error("--workers caps a Ray instance started here; with --address the cluster's own CPUs decide "
                    "(ray start --num-cpus N)")
    if budget_steps is not None and budget_seconds is not None:
        usage_error("--budget-steps and --budget-seconds: give one budget")
    if executor == "ray":
        from ..arena.executors import require_ray

        require_ray()  # a missing extra is one line before the board, not after it
    where = device_or_fail(device)
    try:
        from ..arena.planning import check_tasks, parse_task_options

        grid_sweep = None if not sweep else {} if sweep == ["none"] else parse_sweep(sweep)
        specs = plan(preset, tasks=split_list(tasks) if tasks else None,
                     variants=split_list(variants) if variants else None,
                     seeds=int_list("--seeds", seeds, minimum=0) if seeds is not None else None, data=data,
                     seconds=budget_seconds, steps=budget_steps, precision=precision, sweep=grid_sweep,
                     task_options=parse_task_options(task_option), device=where.type)
        if not specs:  # before grid.json is written: the folder's last board stays
            usage_error("the grid has no run" + (f" ({'; '.join(specs.notes)})" if specs.notes else "")
                        + ": choose other --tasks or --variants")
        path = Path(out_dir) / "results.sqlite"
        stored = Store(path).rows() if path.exists() else []  # a damaged store fails here, before the board
        kept = {r["run_id"] for r in stored if r["status"] == "done" or not retry_failed}  # the runs the grid will skip
        # each task to train built once: refused before any run, not after
        check_tasks([s for s in specs if s.run_id not in kept])
        Store(path)  # an unwritable folder fails here, before the board (a refused grid leaves no store behind)
    except (ValueError, KeyError) as e:
        fail(e)
    for note in specs.notes:  # every run left out, and why, before the board
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    # one process of one thread per core, at most one per run to do: each run trains on one thread anyway
    if workers is None:
        import torch

        todo = sum(s.run_id not in kept for s in specs)
        workers = 1 if executor == "ray" else max(1, min(torch.get_num_threads(), todo))
    grid = LiveGrid(specs, stored=stored)
    # serial runs: the one in progress, its spec and last step
    running: dict = {"serial": workers <= 1 and executor == "local"}
    with Live(grid.render(), console=err, refresh_per_second=4, transient=False) as live:

        def on_event(kind, spec, **info):
            if running["serial"] and kind in ("start", "step"):
                running.update(spec=spec, step=info.get("step", 0))
            elif kind == "end":
                running.pop("spec", None)
            grid.on_event(kind, spec, **info)
            live.update(grid.render())
            if kind == "end" and not err.is_terminal:  # a log file: one plain line per finished run
                row = info["row"]
                result = (f"{row['metric']} {row['value']:.3f} after {row['steps']} steps" if row["status"] == "done"
                          else "failed")
                err.print(f"{run_name(spec)}: {result}", highlight=False, markup=False)

        try:
            run_grid(specs, out_dir, workers=workers, retry_failed=retry_failed, on_event=on_event, executor=executor,
                     address=address)
        except KeyboardInterrupt:
            running["interrupted"] = True
    if running.get("interrupted"):  # the board closed first, then one line on where the grid stopped
        if not err.is_terminal and (grid.current or not running["serial"]):
            err.line()  # rich ends a live board with a newline on a terminal only
        err.print(_interrupted(out_dir, specs, running), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    _close(out_dir, specs, grid.elapsed, as_json, where.type)

def _close(out_dir: str, specs, elapsed, as_json: bool, device: str = "cpu") -> None:
    """After the grid: the cost (where an attention run of its task finished), the report and the
    leaderboard (``elapsed()``: the command's seconds so far); exit 1 when every run failed, a warning for
    each task whose every run did."""
    from ..arena import Store, build_report
    from ..arena.presets import NO_ATTENTION

    done = {r["run_id"]: r["status"] == "done" for r in Store(Path(out_dir) / "results.sqlite").rows()}
    finished = {s.task for s in specs if done.get(s.run_id)}
    attended = {s.task for s in specs if done.get(s.run_id) and s.variant != NO_ATTENTION}
    # no cost beside a task whose every attention run failed
    if specs.cost is not None and specs.cost["task"] in attended:
        _measure_cost(out_dir, specs.cost, device)
    page, board = build_report(out_dir)
    if as_json:
        print_json({**board, "report": str(page), "wall_seconds": elapsed()})
    else:
        _print_leaderboard(board)
        out.print(f"report: {page}  (wall time {elapsed():.0f} s)")
    failed = list(dict.fromkeys(s.task for s in specs if s.task not in finished))
    if failed and not finished:
        err.print(f"[bold red]error:[/] every run of the grid failed ({len(specs)} runs; the reasons are on the board)",
                  soft_wrap=True)
        raise typer.Exit(1)
    if failed:
        err.print(f"[yellow]warning:[/] every run of {', '.join(failed)} failed (the reasons are on the board)",
                  soft_wrap=True)


def _measure_cost(out_dir: str, cost: dict, device: str = "cpu") -> None:
    """After the grid: each variant's training step at the long lengths (:func:`attnlab.arena.cost.measure_cost`),
    one line per measurement; Ctrl-C keeps what was measured (the rerun measures the rest)."""
    from ..arena.cost import measure_cost

    lengths = ", ".join(f"{n:,}" for n in cost["lengths"])
    err.print(f"cost: one training step of {cost['task']}'s model at {lengths} tokens, per variant "
              "(this machine's seconds"
              + ("" if device == "cpu" else f", on {device}") + ")", markup=False, highlight=False)
    try:
        measure_cost(out_dir, cost["task"], cost["variants"], lengths=cost["lengths"],
                     task_options=cost["task_options"], train=cost["train"], device=device,
                     on_progress=lambda v, n: err.print(f"  {v} at {n:,} tokens", markup=False, highlight=False))
    except KeyboardInterrupt:
        err.print(f"interrupted: the cost measurements so far are kept in {Path(out_dir) / 'cost.json'}; "
                  "the same command measures the rest", markup=False, highlight=False)
        raise typer.Exit(130) from None


def _interrupted(out_dir: str, specs: list, running: dict) -> str:
    """Ctrl-C: how many runs the store holds, where the run in progress stopped and what its
    checkpoint keeps, and the command that continues (the same one: stored runs are skipped)."""
    import shlex
    import sys

    from ..arena import Store
    from ..arena.live import run_name
    from ..training import CheckpointError, load_checkpoint

    stored = Store(Path(out_dir) / "results.sqlite").finished()
    done = sum(s.run_id in stored for s in specs)
    head = f"interrupted: {done} of {len(specs)} runs stored in {Path(out_dir) / 'results.sqlite'}"
    spec = running.get("spec")
    if spec is not None:
        folder = Path(out_dir) / "runs" / spec.run_id
        try:
            step = load_checkpoint(folder).meta.get("step", 0)
            kept = f"its checkpoint of step {step} in {folder / 'checkpoint'}, which the rerun resumes"
        except (CheckpointError, OSError):
            kept = "nothing saved yet, so the rerun starts it over"
        head += f"; {run_name(spec)} stopped at step {running.get('step') or 0} ({kept})"
    elif not running.get("serial"):  # several at a time: each resumes from its own checkpoint
        head += "; the runs in progress resume from their checkpoints (those interrupted before their first start over)"
    again = shlex.join(["attnlab", *sys.argv[1:]]) if sys.argv[1:2] == ["arena"] else "the same attnlab arena command"
    return f"{head}; continue with: {again}"


def report(
    out_dir: str = typer.Argument(..., metavar="DIR", help="The --out folder of 'attnlab arena'."),
    as_json: bool = json_option("Print the leaderboard as one JSON object (tasks, average, report) instead of tables."),
) -> None:
    """Rebuild report.html, the charts and the leaderboard from an arena's results store."""
    from ..arena import build_report

    page, board = build_report(out_dir)  # errors: one line, through the CLI's boundary
    if as_json:
        print_json({**board, "report": str(page)})
        return
    _print_leaderboard(board)
    out.print(f"report: {page}")


def _print_leaderboard(board: dict) -> None:
    """The arena's leaderboard: what the grid left out, per task, then the average and the cost;
    ``!`` marks a score with a caveat, explained under its table, as is a failed run (its whole reason)."""
    from ..arena.board import level_names, level_values, sweep_text, task_budget
    from ..arena.charts import label
    from ..arena.report import peak_share

    for note in board.get("notes") or []:
        out.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    for task, entries in board["tasks"].items():
        metric = next((e["metric"] for e in entries if e["metric"]), "score")
        budget = task_budget(entries)
        timed = {e["timed"] for e in entries}
        kind = ("time-budgeted: this machine's scores" if timed.pop() else "step-budgeted") if len(timed) == 1 else ""
        mode = f", {budget} per run" + (f", {kind}" if kind else "") if entries else ""
        places = sorted({e["device"] for e in entries if e.get("device", "cpu") != "cpu"})
        mode += (f", on {' and '.join(places)}: scores agree with the CPU's to rounding, not bit for bit" if places
                 else "")
        swept = any(e.get("sweep") for e in entries)
        levels = level_names(entries)
        t = table(f"{task} ({metric}{', the mean over levels' if levels else ''}{mode}; speed and memory "
                  "relative to dense)",
                  ["variant", "score", *levels, *(["chosen on val: test range"] if swept else []), "speed", "memory",
                   "steps/s", "of peak", "params"])
        t.columns[1].no_wrap = True  # a score, its spread over seeds and its mark stay on one line
        for e in entries:
            if e["value"] is None:
                t.add_row(label(e), "[red]failed[/]", *([""] * len(levels)), *([""] if swept else []),
                          "", "", "", "", "")
                continue
            mark = " [yellow]![/]" if e.get("caveats") else ""
            spread = f" ± {e['spread']:.3f}" if e.get("spread") is not None else ""
            t.add_row(label(e), f"{e['value']:.3f}{spread}{mark}",
                      *("-" if x is None else f"{x:.3f}" for x in level_values(e, levels)),
                      *([sweep_text(e)] if swept else []), fmt_x(e["speed"]), fmt_x(e["memory"]),
                      f"{e['steps_per_second']:.1f}", peak_share(e["peak_fraction"], e["precision"]),
                      f"{e['params']:,}")
        out.print(t)
        for e in entries:
            for c in e.get("caveats", []):
                out.print(f"  [yellow]![/] {escape(label(e))}: {escape(c)}", highlight=False)
        for e in entries:  # the whole reason, wrapped at the console's width (a table cell would cut it)
            if e["value"] is None:
                out.print(f"  [red]failed[/] {escape(label(e))}: {escape(e['error'] or 'no reason stored')}",
                          highlight=False)
    if board["average"] and len(board["tasks"]) > 1:
        t = table(f"average over tasks (ranked: the variants that ran all {len(board['tasks'])})",
                  ["variant", "mean score", "tasks", "dense on the same tasks", "speed vs dense", "memory vs dense"])
        for e in board["average"]:
            ranked = e.get("ranked", True)
            t.add_row(label(e) + ("" if ranked else " [dim](unranked)[/]"), f"{e['value']:.3f}",
                      f"{e['tasks']} of {e.get('of', e['tasks'])}",
                      "" if ranked or e.get("dense_same_tasks") is None else f"{e['dense_same_tasks']:.3f}",
                      fmt_x(e["speed"]), fmt_x(e["memory"]))
        out.print(t)
    _print_cost(board)


def _print_cost(board: dict) -> None:
    """The cost measurements of the report (``board["cost"]``): per variant, its speed and memory
    relative to the fused dense at each length, and its memory relative to the materialising dense."""
    cost = board.get("cost")
    if not cost:
        return
    from ..arena.cost import REFERENCE

    lengths = cost["lengths"]
    t = table(f"cost: one training step of {cost['task']}'s model (speed and memory vs the fused dense; "
              "this machine's seconds)",
              ["variant", *(f"{n:,}: speed, memory" for n in lengths), f"{lengths[-1]:,}: memory vs {REFERENCE}"])
    for v, per in cost["variants"].items():
        cells = []
        for n in lengths:
            r = per.get(str(n))
            projected = " (projected)" if r and r.get("projected") else ""
            cells.append("-" if r is None else f"{fmt_x(r['speed'])}, {fmt_x(r['memory'])}{projected}")
        last = per.get(str(lengths[-1]))
        t.add_row(v, *cells,
                  "-" if not last or last.get("memory_vs_naive") is None else f"{last['memory_vs_naive']:.3f}x")
    out.print(t)
