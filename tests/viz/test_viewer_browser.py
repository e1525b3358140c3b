"""The attention viewer in a real headless Chromium (Debian's package, driven by Playwright):
no console output, and hovering / clicking tokens changes what is drawn, checked against the
page's own data decoded here with numpy."""

import base64
import json
import re
import shutil

import numpy as np
import pytest

from attnlab import pretrained
from attnlab.viz.viewer import pretrained_view, write_viewer

pytest.importorskip("transformers")  # the tiny model folder is written by transformers
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright drives the browser (a dev dependency)")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by `make test`")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
PAD_TOP, ROW_H = 28, 16  # the head view's layout (viewer.html) below 2,000 tokens


def page_data(path):
    text = path.read_text(encoding="utf-8")
    d = json.loads(re.search(r'<script id="attnlab-data" type="application/json">(.*?)</script>', text, re.S).group(1))
    shape = (d["layers"], d["heads"], d["n"], d["topk"])
    weights = np.frombuffer(base64.b64decode(d["attention"]["weight"]), "<f2").astype(np.float32).reshape(shape)
    return d, weights


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    logs = []
    page.on("console", lambda m: logs.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: logs.append(f"error: {e}"))
    page.goto(path.as_uri())
    page.wait_for_function("window.attnlab && window.attnlab.ready === true", timeout=30000)
    return page, logs


def test_hover_and_click_change_the_head_view_at_512_tokens(browser, tmp_path, tiny_bert_512):
    m = pretrained.load(tiny_bert_512)
    text = " ".join(["the law will never be perfect but its application should be just"] * 50)
    path = write_viewer(tmp_path / "v.html", pretrained_view(m, text, truncate=True))
    d, w = page_data(path)
    assert d["n"] == 512
    page, logs = open_page(browser, path)
    api = lambda expr: page.evaluate("() => " + expr)  # noqa: E731
    assert api("window.attnlab.state") == {"layer": 0, "head": 0, "mode": "attention", "selected": [], "hover": None}
    assert api("document.querySelectorAll('#model-view canvas').length") == d["layers"] * d["heads"]
    assert api("window.attnlab.linesDrawn") == int((w[0, 0] >= 0.01).sum())  # every row's lines
    canvas = page.locator("#head-view")
    before = canvas.screenshot()
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + 40, box["y"] + PAD_TOP + ROW_H * 9 + ROW_H / 2)  # hover token 9
    assert api("window.attnlab.state.hover") == 9
    assert api("window.attnlab.linesDrawn") == int((w[0, 0, 9] >= 0.01).sum())
    hovered = canvas.screenshot()
    assert hovered != before
    for row in (2, 9):
        page.mouse.click(box["x"] + 40, box["y"] + PAD_TOP + ROW_H * row + ROW_H / 2)
    page.mouse.move(5, 5)
    assert api("window.attnlab.state.selected") == [2, 9] and api("window.attnlab.state.hover") is None
    assert api("window.attnlab.linesDrawn") == int((w[0, 0, [2, 9]] >= 0.01).sum())
    assert canvas.screenshot() not in (before, hovered)
    # the steps panel recomputes softmax(scale q . k) in the page and agrees with the model
    assert api("document.querySelectorAll('#steps tbody tr').length") == 20
    assert api("window.attnlab.stepsMaxDiff") < 1e-2
    page.locator("#model-view canvas").nth(d["heads"] + 3).click()  # layer 2, head 4
    assert api("window.attnlab.state.layer") == 1 and api("window.attnlab.state.head") == 3
    api("window.attnlab.set({mode: 'rollout'})")
    assert page.eval_on_selector("#head", "e => e.disabled")
    page.click("#clear")
    assert api("window.attnlab.state.selected") == []
    assert not logs, logs


def test_the_lecture_sentence_shows_its_attending_to_law(browser, tmp_path, minilm):
    path = write_viewer(tmp_path / "law.html",
                        pretrained_view(minilm, "The law will never be perfect, but its application should be just."))
    d, w = page_data(path)
    page, logs = open_page(browser, path)
    i = d["tokens"].index("its")
    api = lambda expr: page.evaluate("() => " + expr)  # noqa: E731
    api("window.attnlab.set({layer: 3, head: 1})")  # layer 4, head 2 (1-based): the strongest its -> law head
    api(f"window.attnlab.hover({i})")
    first = page.inner_text("#steps tbody tr:first-child").split()
    assert "law" in first[0] and float(first[-1]) > 0.7
    assert not logs, logs
