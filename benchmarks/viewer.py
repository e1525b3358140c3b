"""How fast the attention viewer's page renders in a real headless Chromium, by input length.

    python benchmarks/viewer.py -o benchmarks/results/viewer-2026-11-22-cpu2.txt

For each length, ``attnlab view``'s page for all-MiniLM-L6-v2 on standard-library source cut to
that many tokens is opened ``--repeats`` times in a fresh tab of Debian's Chromium (Playwright,
headless, software rendering). Reported: the page's size, the time from navigation to the page
saying it is drawn (``window.attnlab.ready``: data decoded, 72 heat maps and the head view
drawn), the page's own count from its script start, and one hover redraw (head view + steps
panel), as medians. The issue's target: a 512-token input renders in under 2 s.
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16,128,512")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-o", "--output", help="also write the table here")
    args = ap.parse_args()
    import json as json_module

    from playwright.sync_api import sync_playwright

    from attnlab import pretrained
    from attnlab.viz.viewer import pretrained_view, write_viewer

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (apt install chromium)")
    model = pretrained.load("all-MiniLM-L6-v2")
    source = inspect.getsource(json_module) * 4
    lines = [f"attnlab view page of all-MiniLM-L6-v2 in headless Chromium ({chromium}), median of {args.repeats} loads",
             f"{'tokens':>7} {'page MB':>8} {'navigate->drawn s':>18} {'in-page ms':>11} {'hover redraw ms':>16}"]
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        for n in (int(x) for x in args.lengths.split(",")):
            ids = model.tokenizer.encode(source).ids[1 : n - 1]
            text = model.tokenizer.decode(ids)
            view = pretrained_view(model, text, truncate=True)
            path = write_viewer(Path(tmp) / f"v{n}.html", view)
            walls, inpage, hovers = [], [], []
            for _ in range(args.repeats):
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))  # noqa: B023  (called in this iteration)
                t0 = time.perf_counter()
                page.goto(path.as_uri())
                page.wait_for_function("window.attnlab && window.attnlab.ready === true", timeout=60000, polling=5)
                walls.append(time.perf_counter() - t0)
                inpage.append(page.evaluate("() => window.attnlab.renderMs"))
                hovers.append(page.evaluate("""(n) => { const a = window.attnlab, t = performance.now();
                    for (let k = 0; k < 20; k++) a.hover(k % n); a.hover(null); return (performance.now() - t) / 21; }""",
                                            len(view.tokens)))
                if errors:
                    raise SystemExit(f"page errors at {n} tokens: {errors}")
                page.close()
            lines.append(f"{len(view.tokens):>7} {path.stat().st_size / 1e6:>8.1f} {statistics.median(walls):>18.2f} "
                         f"{statistics.median(inpage):>11.0f} {statistics.median(hovers):>16.1f}")
            print(lines[-1], flush=True)
        browser.close()
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
