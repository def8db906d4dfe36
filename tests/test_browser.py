"""The learner's view in a real browser: JupyterLab on 127.0.0.1, notebook 01 in headless Chromium, cells run,
the KV calculator's slider dragged, and the plot checked to redraw. The screenshots are kept as test artifacts
(``build/test-artifacts/``). Skipped, with the reason, only where no Chromium can be found or installed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from kvlab.runtime import config
from kvlab.runtime.serving import free_port

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_kv_cache_by_hand.ipynb"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-quic",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# The redraw replaces the figure's element, so look up the last plot on the page afresh each time.
REDRAWN = """(want) => {
  const plot = [...document.querySelectorAll('.jp-OutputArea .js-plotly-plot')].pop();
  const title = plot && plot.querySelector('.gtitle');
  return !!title && title.textContent.replace(/\\u00a0/g, ' ').includes(want);
}"""


def chromium() -> str | None:
    """The system Chromium (Debian's package; ``KVLAB_CHROMIUM`` overrides)."""
    for name in (os.environ.get("KVLAB_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab serving a copy of notebook 01 (autosave must not touch the repo) on 127.0.0.1 and a free port."""
    import httpx

    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    port, token = free_port(), "kvlab-browser-test"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "jupyterlab.log", "w")  # noqa: SIM115 - closed in teardown
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=os.environ | {"KVLAB_QUICK": "1", "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config")})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/api/status", params={"token": token}, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail(f"JupyterLab did not start in 90 s; log:\n{(tmp_path / 'jupyterlab.log').read_text()[-2000:]}")
    yield f"{url}/lab/tree/{NOTEBOOK}?token={token}"
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def calculator_cell_index() -> int:
    """Position of the code cell that shows the KV calculator."""
    nb = nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4)
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "kv_calculator" in c.source)


@pytest.mark.notebook
def test_notebook_01_calculator_in_a_real_browser(jupyterlab):
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("No Chromium on this machine: install Debian's 'chromium' package (make test does, when it runs as "
                    "root with apt-get), or point KVLAB_CHROMIUM at a Chromium binary.")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    artifacts = config.build_dir() / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    upto = calculator_cell_index()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(jupyterlab, timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], .jp-Toolbar-kernelStatus",
                                   timeout=120_000, state="attached")
            slider = page.locator(".widget-slider", has_text="sequences").first
            for attempt in range(3):  # a key press sent while the kernel is still starting can be lost: run them again
                page.locator(".jp-Notebook .jp-Cell").first.click()
                page.keyboard.press("Escape")  # command mode: Shift+Enter runs the cell and moves on
                for _ in range(upto + 1):  # run every cell from the top through the calculator
                    page.keyboard.press("Shift+Enter")
                    time.sleep(0.2)
                try:
                    slider.wait_for(timeout=120_000)
                    break
                except PlaywrightTimeout:
                    if attempt == 2:
                        raise
            plot = page.locator(".jp-OutputArea .js-plotly-plot").last
            plot.wait_for(timeout=60_000)
            plot.scroll_into_view_if_needed()
            before = plot.inner_html()
            page.screenshot(path=str(artifacts / "browser-notebook01-before.png"), full_page=False)

            handle = slider.locator(".noUi-handle").first
            box = handle.bounding_box()
            track = slider.locator(".noUi-target, .slider").first.bounding_box()
            assert box and track, "the sequences slider has no visible handle"
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(track["x"] + track["width"] * 0.8, box["y"] + box["height"] / 2, steps=12)
            page.mouse.up()
            readout = slider.locator(".widget-readout").first.inner_text()
            assert readout.strip().isdigit() and readout.strip() != "16", f"the slider did not move (readout {readout!r})"
            page.wait_for_function(REDRAWN, arg=f"{int(readout)} sequences", timeout=60_000)  # drags redraw on the way
            redrawn = page.locator(".jp-OutputArea .js-plotly-plot").last
            after, title = redrawn.inner_html(), redrawn.locator(".gtitle").first.text_content() or ""
            page.screenshot(path=str(artifacts / "browser-notebook01-after.png"), full_page=False)
        finally:
            browser.close()
    assert after != before
    assert f"{int(readout.strip())} sequences" in title.replace("\xa0", " "), f"the redrawn plot's title does not show the new value: {title!r}"
    assert (artifacts / "browser-notebook01-after.png").stat().st_size > 20_000


@pytest.mark.notebook
def test_a_built_page_shows_its_formula_and_calculator_with_the_network_blocked(tmp_path):
    """A lesson page as ``make course`` builds it (a formula, the KV calculator executed by a kernel), opened from disk
    in Chromium with every http(s) request refused: the formula renders as MathML, the calculator's figure draws, and
    the page asked for nothing on the network."""
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("No Chromium on this machine: install Debian's 'chromium' package or point KVLAB_CHROMIUM at one.")
    from playwright.sync_api import sync_playwright

    from kvlab.course import build
    from kvlab.runtime import kernels

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("$$\\text{KV bytes} = 2 \\times \\text{layers} \\times \\text{kv\\_heads}$$"),
        nbformat.v4.new_code_cell("import kvlab\n\nkvlab.setup_notebook()\nkvlab.widgets.kv_calculator()")])
    nbformat.write(nb, tmp_path / "page.ipynb")
    kernels.execute(str(tmp_path / "page.ipynb"), str(tmp_path / "executed.ipynb"), cwd=str(tmp_path))
    page_path = build.to_html(tmp_path / "executed.ipynb", tmp_path / "html")
    asked: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.route("http*://**", lambda route: (asked.append(route.request.url), route.abort()))
        try:
            page.goto(page_path.as_uri())
            page.wait_for_selector("math mtext", timeout=30_000)
            assert "kv_heads" in page.locator("math").first.text_content()
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)  # the calculator's figure, drawn
            page.screenshot(path=str(tmp_path / "offline.png"))
        finally:
            browser.close()
    assert asked == [], asked
