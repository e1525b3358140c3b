"""The leaderboard's arithmetic, report.html (self-contained), and its rendering in Chromium."""

import shutil
import subprocess

import pytest
import torch

from attnlab.arena.report import build_report, leaderboard
from attnlab.arena.store import Store


def _row(run_id, task, variant, value, sps, peak, status="done", seed=0, error=None, config=None, history=None):
    return {"run_id": run_id, "task": task, "variant": variant, "seed": seed, "config": config or {"steps": 10}, "status": status,
            "metric": "accuracy" if status == "done" else None, "value": value, "train_seconds": 1.0, "steps": 10,
            "steps_per_second": sps, "peak_bytes": peak, "params": 100, "error": error, "history": history}


ROWS = [
    _row("1", "a", "dense", 0.9, 10.0, 1000), _row("2", "a", "linear", 0.5, 40.0, 250),
    _row("3", "b", "dense", 0.8, 20.0, 2000, config={"steps": 100000, "seconds": 30.0},
         history=[{"step": 10, "val": 0.5, "loss": 1.0, "seconds": 12.5}, {"step": 20, "val": 0.8, "loss": 0.5, "seconds": 30.1}]),
    _row("4", "b", "linear", 0.7, 20.0, 1000, config={"steps": 100000, "seconds": 30.0},
         history=[{"step": 40, "val": 0.7, "loss": 1.0, "seconds": 30.0}]),
    _row("5", "b", "nystrom", None, None, None, status="failed", error="ValueError: not <causal> & co"),
    _row("6", "a", "linear", 0.7, 40.0, 250, seed=1),
]


def test_leaderboard_is_relative_to_dense_and_averages_seeds_and_tasks():
    board = leaderboard(ROWS)
    a = {e["variant"]: e for e in board["tasks"]["a"]}
    assert a["linear"]["value"] == pytest.approx(0.6) and a["linear"]["seeds"] == 2
    assert a["linear"]["speed"] == pytest.approx(4.0) and a["linear"]["memory"] == pytest.approx(0.25)
    b = {e["variant"]: e for e in board["tasks"]["b"]}
    assert b["nystrom"]["value"] is None and "causal" in b["nystrom"]["error"]
    avg = {e["variant"]: e for e in board["average"]}
    assert avg["linear"]["value"] == pytest.approx((0.6 + 0.7) / 2)
    assert avg["linear"]["speed"] == pytest.approx(2.0)  # geometric mean of 4x and 1x
    assert avg["linear"]["memory"] == pytest.approx((0.25 * 0.5) ** 0.5)
    assert [e["variant"] for e in board["average"]] == ["dense", "linear"]
    assert a["dense"]["budget"] == "10 steps" and b["dense"]["budget"] == "30 s"


def _arena(tmp_path):
    from safetensors.torch import save_file

    store = Store(tmp_path / "results.sqlite")
    for r in ROWS:
        store.add(r)
    (tmp_path / "runs" / "1").mkdir(parents=True)
    save_file({"map_0": torch.softmax(torch.randn(6, 6), -1), "map_1": torch.softmax(torch.randn(6, 6), -1)},
              str(tmp_path / "runs" / "1" / "attention.safetensors"))
    return build_report(tmp_path)


def test_report_html_is_self_contained(tmp_path):
    page, _ = _arena(tmp_path)
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 3  # the chart, the curves (task b's) and task a's maps (b has none)
    assert "a: 10 steps; b: 30 s" in text and "b (30 s per run)" in text
    assert "http" not in text.replace("https://arxiv", "") and "<script" not in text
    assert "not &lt;causal&gt; &amp; co" in text  # escaped
    assert (tmp_path / "lra.png").stat().st_size > 10_000 and (tmp_path / "attention-a.png").exists()
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="no results.sqlite"):
        build_report(tmp_path / "nothing")


def test_curves_draw_one_line_per_variant_from_the_histories(tmp_path):
    import matplotlib.pyplot as plt

    from attnlab.arena.report import plot_curves

    seen = {}
    real_save = plt.Figure.savefig

    def spy(fig, *a, **k):
        seen["lines"] = {ax.get_title(): {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}
                         for ax in fig.axes if ax.get_title()}
        return real_save(fig, *a, **k)

    plt.Figure.savefig = spy
    try:
        assert plot_curves(ROWS, tmp_path / "c.png").exists()
    finally:
        plt.Figure.savefig = real_save
    assert seen["lines"] == {"b": {"dense": ([12.5, 30.1], [0.5, 0.8]), "linear": ([30.0], [0.7])}}
    assert plot_curves(ROWS[:2], tmp_path / "none.png") is None  # no history: no chart


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is installed by `make test`")
def test_report_renders_in_headless_chromium_without_console_errors(tmp_path):
    import matplotlib.image as mpimg

    page, _ = _arena(tmp_path)
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    img = mpimg.imread(shot)[..., :3]
    assert img.shape[0] == 1600 and img.shape[1] == 1200
    assert float(img.std()) > 0.05  # not blank: text, tables and the chart's bubbles
    chart_band = img[250:900]  # the chart sits near the top of the page
    assert len({tuple((p * 255).astype(int) // 32) for p in chart_band.reshape(-1, 3)[::97]}) > 8  # many colours: a drawn chart
