"""Build the course: execute every numbered notebook headless (papermill), write HTML pages and an index."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from kvlab.runtime import config, figures, hardware, kernels
from kvlab.runtime.claims import read_claims


@dataclass
class NotebookRun:
    """What happened to one notebook during a build."""

    name: str
    title: str
    ok: bool
    seconds: float
    executed: Path
    html: Path | None
    error: str = ""
    startup_s: float = 0.0  # engine and service start-ups within ``seconds`` (the rest is measurement)
    startups: int = 0
    claims: list[dict] = field(default_factory=list)  # the takeaways it stated from its numbers (``kvlab.claim``)

    @property
    def missed(self) -> list[dict]:
        """The takeaways that did not hold on this build."""
        return [c for c in self.claims if not c["held"]]


def lessons(folder: Path | None = None) -> list[Path]:
    """The numbered lesson notebooks (``00_…``, ``01_…``), in order."""
    folder = folder or config.REPO_ROOT / "notebooks"
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))


def notebook_title(path: Path) -> str:
    """The first markdown heading of a notebook, or its file name."""
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return path.stem


def execute(notebook: Path, out_dir: Path, parameters: dict | None = None, kernel_name: str = "python3") -> Path:
    """Run one notebook top to bottom with papermill; the executed copy is written even when a cell fails."""

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / notebook.name
    kernels.execute(notebook, executed, parameters, kernel_name=kernel_name, log_output=False)
    return executed


#: A link from one lesson to another, as written in the notebooks (it works in JupyterLab): ``03_prefix_caching.ipynb#…``.
_LESSON_LINK = re.compile(r'href="([0-9]{2}_[A-Za-z0-9_]+)\.ipynb(#[^"]*)?"')


def to_html(executed: Path, out_dir: Path) -> Path:
    """Convert an executed notebook to a standalone HTML page that works offline: plots embedded, formulas as MathML,
    widgets replaced by what they showed when the notebook ran (``static_widgets``), no script from a CDN. Links to other lessons
    are written once, as JupyterLab follows them (``03_prefix_caching.ipynb#4.-Token-identity…``); here they become
    links to the lessons' pages (``03_prefix_caching.html#…``), anchors unchanged."""
    import nbformat
    from nbconvert import HTMLExporter

    out_dir.mkdir(parents=True, exist_ok=True)
    nb = math_as_mathml(static_widgets(nbformat.read(executed, as_version=4)))
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    body = offline_page(body)
    body = _LESSON_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', body)
    page = out_dir / f"{executed.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page


#: Display formulas in rendered Markdown (``$$…$$``), turned into MathML (browsers render it without MathJax).
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
#: Scripts nbconvert's template loads from a CDN: MathJax (and its config) and require.js (for the widget manager).
_CDN_SCRIPTS = re.compile(r'<script[^>]*src="https?://[^"]*(?:mathjax|require\.js|jupyter-widgets)[^"]*"[^>]*>\s*</script>'
                          r'|<script type="text/x-mathjax-config">.*?</script>', re.S | re.I)


def offline_page(body: str) -> str:
    """A page that needs no network: the CDN's MathJax and require.js scripts removed (formulas are MathML already)."""
    return _CDN_SCRIPTS.sub("", body)


def math_as_mathml(nb: Any) -> Any:
    """Every ``$$…$$`` formula of the Markdown cells as MathML, which browsers render without MathJax (and offline)."""
    import latex2mathml.converter

    def mathml(m: re.Match) -> str:
        tex = re.sub(r"\\text\{([^}]*)\}", lambda t: r"\text{" + t.group(1).replace(r"\_", "_") + "}", m.group(1))
        return latex2mathml.converter.convert(tex, display="block")

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _DISPLAY_MATH.sub(mathml, cell.source)
    return nb


def static_widgets(nb: Any) -> Any:
    """Each widget view replaced by the outputs its Output widgets held when the notebook ran (saved in the notebook's
    widget state), with a note: a static page has no kernel to redraw them, and no widget manager to load."""
    import nbformat

    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})

    def held(model_id: str) -> list[dict]:
        model = state.get(model_id, {})
        if model.get("model_name") == "OutputModel":
            return list(model.get("state", {}).get("outputs", []))
        return [o for child in model.get("state", {}).get("children", []) for o in held(child.removeprefix("IPY_MODEL_"))]

    note = {"output_type": "display_data", "metadata": {}, "data": {"text/markdown": (
        "*An interactive widget: in JupyterLab its controls redraw this output; this page shows what it drew when the "
        "lesson ran.*")}}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            outputs += [nbformat.from_dict(o) for o in [note, *held(view["model_id"])]] if view else [out]
        cell.outputs = outputs
    nb.metadata.pop("widgets", None)
    return nb


class _Anchors(HTMLParser):
    """Every ``id`` and every ``href`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)
            if key == "href" and value and tag == "a":
                self.hrefs.append(value)


def broken_links(out: Path) -> list[str]:
    """Follow every relative link and anchor of the built course (``index.html`` and ``html/*.html``) and return the
    ones that lead nowhere, as ``page: link``. External links (``http…``, ``mailto:``) are not followed."""
    pages = [out / "index.html", *sorted((out / "html").glob("*.html"))]
    parsed: dict[Path, _Anchors] = {}

    def parse(page: Path) -> _Anchors:
        if page not in parsed:
            parser = _Anchors()
            parser.feed(page.read_text(encoding="utf-8"))
            parsed[page] = parser
        return parsed[page]

    broken = []
    for page in pages:
        if not page.is_file():
            continue
        for href in parse(page).hrefs:
            if re.match(r"^[a-z][a-z0-9+.-]*:", href):  # http:, https:, mailto:, data:, javascript:
                continue
            target, _, fragment = href.partition("#")
            target_page = (page.parent / unquote(target)).resolve() if target else page
            if not target_page.is_file():
                broken.append(f"{page.relative_to(out)}: {href} (no such file)")
            elif fragment and target_page.suffix == ".html" and not {fragment, unquote(fragment)} & parse(target_page).ids:
                broken.append(f"{page.relative_to(out)}: {href} (no such anchor)")
    return broken


def build(notebooks: list[Path] | None = None, out: Path | None = None, run: bool = True) -> tuple[Path, list[NotebookRun]]:
    """Execute the notebooks, write one HTML page each and ``index.html``; a failure does not stop the rest. With
    ``run=False`` the pages are made from the notebooks as written (no outputs): a preview of the course's prose and
    links in seconds, for whoever edits it."""
    from tqdm.auto import tqdm

    out = out or config.build_dir()
    runs: list[NotebookRun] = []
    for nb in tqdm(notebooks or lessons(), desc="notebooks", unit="nb"):
        start = time.perf_counter()
        executed, error = out / "notebooks" / nb.name, ""
        startup_log, claims_log = out / "logs" / f"startups-{nb.stem}.jsonl", out / "logs" / f"claims-{nb.stem}.jsonl"
        startup_log.parent.mkdir(parents=True, exist_ok=True)
        startup_log.unlink(missing_ok=True)
        claims_log.unlink(missing_ok=True)
        before = {k: os.environ.get(k) for k in ("KVLAB_STARTUP_LOG", "KVLAB_CLAIMS_LOG")}
        os.environ["KVLAB_STARTUP_LOG"] = str(startup_log)  # the kernel inherits it: config.note_startup writes there
        os.environ["KVLAB_CLAIMS_LOG"] = str(claims_log)  # and kvlab.claim here
        try:
            if run:
                execute(nb, out / "notebooks")
            else:
                executed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(nb, executed)
        except Exception as exc:  # noqa: BLE001 - recorded, the build goes on
            error = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
        finally:
            for key, value in before.items():
                os.environ.pop(key)
                if value is not None:
                    os.environ[key] = value
        seconds = time.perf_counter() - start
        if run and not error and executed.exists():
            problems = figure_problems(executed)
            error = f"a figure reaches far beyond its data ({problems[0]})" if problems else ""
        starts = startup_seconds(startup_log)
        page = to_html(executed, out / "html") if executed.exists() else None
        runs.append(NotebookRun(nb.stem, notebook_title(nb), not error, seconds, executed, page, error,
                                min(sum(starts), seconds), len(starts), read_claims(claims_log)))
    index = write_index(runs, out)
    return index, runs


def machine_line() -> str:
    """The machine a build ran on, as the report names it at the top: CPU, cores, vector flags and the model dtype."""
    cpu, flags = hardware.cpu_model_and_flags()
    dtype, why = hardware.model_dtype()
    return (f"{cpu}, {len(os.sched_getaffinity(0))} cores usable, flags {', '.join(flags) or 'none of note'}; "
            f"model dtype {dtype} ({why})")


REFERENCE_NOTE = (" Reference: the same full-mode lessons on other machines (<code>data/reference/lesson_times.csv</code>); "
                  "the budget is 6 minutes a lesson and 25 for the course, on a bf16-capable CPU and on an AVX2-only "
                  "one running float32.")
LESSON_TIMES = config.REPO_ROOT / "data" / "reference" / "lesson_times.csv"


def reference_times(path: Path = LESSON_TIMES) -> dict[str, dict[str, float]]:
    """Full-mode lesson times measured on other machines (``data/reference/lesson_times.csv``): {"machine, dtype
    (date)": {lesson: seconds}} — the report sets a full build's times beside them, so both CPU kinds are in view."""
    import csv

    times: dict[str, dict[str, float]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            times.setdefault(f"{row['machine']}, {row['dtype']} ({row['date']})", {})[row["lesson"]] = float(row["seconds"])
    return times


def missed_section(runs: list[NotebookRun]) -> str:
    """The report's list of takeaways that did not hold on this build, each with what the lesson printed instead."""
    items = [f"<li><b>{html.escape(r.name)}</b>: expected “{html.escape(c['claim'])}” — this build: "
             f"“{html.escape(c['instead'])}”</li>" for r in runs for c in r.missed]
    if not items:
        return "<p>Every takeaway the lessons state from their numbers held on this build.</p>" if any(r.claims for r in runs) else ""
    return f"<h2>Takeaways that did not hold on this build</h2><ul>{''.join(items)}</ul>"


def figure_problems(executed: Path) -> list[str]:
    """Every plotly figure of an executed notebook checked for labels or axis ranges far beyond its data
    (``figures.output_problems``): one line per problem, naming the cell."""
    import nbformat

    return [f"cell {i}: {p}" for i, cell in enumerate(nbformat.read(executed, as_version=4).cells)
            if cell.cell_type == "code" for p in figures.output_problems(cell.get("outputs", []))]


def startup_seconds(log: Path) -> list[float]:
    """The start-up times (s) a lesson's engines and services recorded in its start-up log (``config.note_startup``)."""
    if not log.is_file():
        return []
    return [float(json.loads(line)["seconds"]) for line in log.read_text().splitlines() if line.strip()]


def highlights(executed: Path) -> tuple[str, str]:
    """From an executed lesson: its key figure (the first plotly output of the cell tagged ``key-figure``) as an HTML
    fragment, and its headline numbers (the Summary cell's Markdown output) as HTML; empty strings when missing."""
    import mistune
    import nbformat
    import plotly.io as pio

    nb = nbformat.read(executed, as_version=4)
    figure = summary = ""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        outputs = [o.get("data", {}) for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]
        if not figure and "key-figure" in cell.get("metadata", {}).get("tags", []):
            spec = next((d["application/vnd.plotly.v1+json"] for d in outputs if "application/vnd.plotly.v1+json" in d), None)
            if spec is not None:
                fig = pio.from_json(json.dumps(spec))
                fig.update_layout(height=360)
                figure = fig.to_html(full_html=False, include_plotlyjs=False, default_width="100%")
        previous = nb.cells[i - 1] if i else None
        if previous is not None and previous.cell_type == "markdown" and previous.source.startswith("## Summary"):
            text = next((d["text/markdown"] for d in outputs if "text/markdown" in d), "")
            summary = mistune.html(text) if text else ""
    return figure, summary


def write_index(runs: list[NotebookRun], out: Path) -> Path:
    """The course report: for every executed lesson, its status and run time, its key figure and its headline
    numbers (the Summary written from that run), linking to the full page. Works offline (plotly.js inlined once)."""
    from plotly.offline import get_plotlyjs

    rows, sections = [], []
    references = {} if config.quick() else reference_times()  # quick-mode times are not comparable with them
    for r in runs:
        link = f'<a href="html/{r.html.name}">{html.escape(r.title)}</a>' if r.html else html.escape(r.title)
        status = "ran top to bottom" if r.ok else f"failed: {html.escape(r.error)}"
        if r.claims:
            status += f"; {len(r.claims) - len(r.missed)} of {len(r.claims)} takeaways held"
        rows.append(f"<tr><td>{html.escape(r.name)}</td><td>{link}</td><td class='{'ok' if r.ok else 'bad'}'>{status}</td>"
                    f"<td>{r.seconds:.0f} s</td><td>{r.startup_s:.0f} s ({r.startups})</td>"
                    f"<td>{r.seconds - r.startup_s:.0f} s</td>"
                    + "".join(f"<td>{t[r.name]:.0f} s</td>" if r.name in t else "<td>—</td>" for t in references.values())
                    + "</tr>")
        figure, summary = highlights(r.executed) if r.executed.exists() else ("", "")
        if figure or summary:
            sections.append(f"<section><h2>{link}</h2><div class='fig'>{figure}</div>"
                            f"<div class='numbers'><h3>Headline numbers from this build</h3>{summary}</div></section>")
    mode = "quick (KVLAB_QUICK=1)" if config.quick() else "full"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>KV Lab — course report</title>
<script type="text/javascript">{get_plotlyjs()}</script>
<style>body{{font-family:system-ui,sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse;width:100%}}td,th{{border-bottom:1px solid #ddd;padding:.4rem;text-align:left}}
.ok{{color:#1a7f37}}.bad{{color:#cf222e}}section{{border-top:2px solid #eee;margin-top:2rem}}
.numbers{{background:#f6f8fa;padding:.2rem 1rem;border-radius:6px}}</style></head><body>
<h1>KV Lab — course report</h1>
<p><b>Machine:</b> {html.escape(machine_line())}</p>
<p>Built {time.strftime('%Y-%m-%d %H:%M')} in {mode} mode with model <code>{html.escape(config.model_name())}</code>.
Every number and figure below was measured during this build, on this machine.</p>
<table><tr><th>lesson</th><th>title</th><th>status</th><th>run time</th><th>start-ups (how many)</th>
<th>measurement and the rest</th>{''.join(f"<th>reference: {html.escape(k)}</th>" for k in references)}</tr>
{''.join(rows)}
<tr><th colspan="3">whole course</th><th>{sum(r.seconds for r in runs):.0f} s</th>
<th>{sum(r.startup_s for r in runs):.0f} s</th><th>{sum(r.seconds - r.startup_s for r in runs):.0f} s</th>
{''.join(f"<th>{sum(t.values()):.0f} s</th>" for t in references.values())}</tr>
</table>
<p>Start-ups: engines (<code>make_engine</code>) and services (vLLM server, gateway, Redis) starting, as each recorded
it; two started side by side count twice.{REFERENCE_NOTE if references else ""}</p>
{missed_section(runs)}
{''.join(sections)}
</body></html>"""
    index = out / "index.html"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(page, encoding="utf-8")
    return index
