"""The course's main job on notebook 00: papermill execution, HTML page, index; no vLLM noise shown. The build runs
the base model (``KVLAB_MODEL``): this one run is also lesson 00's run beyond the course model
(tests/test_second_model.py); nbval runs lesson 00 on the course model, with its check for 'Paris'."""

from pathlib import Path

import nbformat
import pytest

from kvlab.course import build as course
from kvlab.runtime import config

pytestmark = pytest.mark.notebook


def test_build_notebook_00_writes_html_and_index(tmp_path, monkeypatch):
    """The course build on lesson 00, run with the base model (tests/test_second_model.py): a third layout (OPT: one KV
    head per query head, a ReLU MLP, learned positions, 2,048 positions) with no chat template, so chats go out in KV
    Lab's plain lines (vLLM alone refuses: vllm/renderers/hf.py), said in one note and shown as the prompt the engine
    received; the 'Paris' check is skipped."""
    from kvlab.runtime.model import BASE_MODEL

    monkeypatch.setenv("KVLAB_MODEL", BASE_MODEL)  # the kernel papermill starts inherits it
    nb = course.lessons()[0]
    assert nb.name == "00_setup_and_first_tokens.ipynb"
    index, runs = course.build([nb], tmp_path)
    assert runs[0].ok, runs[0].error
    assert runs[0].startups == 1 and 0 < runs[0].startup_s < runs[0].seconds  # lesson 00 starts one engine
    page = tmp_path / "html" / "00_setup_and_first_tokens.html"
    assert page.exists() and "plotly" in page.read_text()
    report = index.read_text()
    assert 'href="html/00_setup_and_first_tokens.html"' in report
    # the course report: the lesson's key figure (a plotly div) and its headline numbers (the Summary of this run)
    assert "Headline numbers from this build" in report and report.count('class="plotly-graph-div"') == 1
    numbers = report.split("Headline numbers from this build", 1)[1]
    assert "TTFT" in numbers and "ms" in numbers
    assert "start-ups (how many)" in report and "whole course" in report
    executed = nbformat.read(tmp_path / "notebooks" / nb.name, as_version=4)  # texts joined, as a notebook shows them
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    shown = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs), "progress widget shown"
    for noise in (" INFO ", "WARNING", "Loading safetensors", "it/s]", "Triton"):
        assert noise not in shown, f"learners would see {noise!r}"
    assert BASE_MODEL in shown and "check for 'Paris' is skipped" in shown  # the environment report names the model
    assert "has no chat template" in shown and repr("User: What is the capital of France?\nAssistant:") in shown


def test_every_headless_run_talks_over_ipc_sockets_with_a_blocking_client(tmp_path, capfd):
    """The kernels papermill starts (``make course``, labs, grids, tests: all through ``kernels.execute``) listen on
    Unix sockets, not TCP ports, and are read by jupyter_client's blocking client, whose waits can't miss a reply
    (kvlab/runtime/kernels.py says why: papermill's default asyncio client hung CI twice)."""
    import nbformat
    from jupyter_client.blocking import BlockingKernelClient

    from kvlab.runtime import kernels

    assert isinstance(kernels.IPCKernelManager().client(), BlockingKernelClient)
    callers = [str(path.relative_to(config.REPO_ROOT)) for folder in ("kvlab", "tests", "instructors", "benchmarks")
               for path in (config.REPO_ROOT / folder).rglob("*.py")
               if path != Path(__file__) and "execute_notebook(" in path.read_text()]
    assert callers == ["kvlab/runtime/kernels.py"], callers
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from ipykernel.kernelapp import IPKernelApp\napp = IPKernelApp.instance()\nprint(app.transport, app.shell_port)"),
        nbformat.v4.new_code_cell("import ipywidgets as w\nout = w.Output()\nwith out:\n    print('in a widget')\nout")])
    source = tmp_path / "probe.ipynb"
    nbformat.write(nb, source)
    executed = nbformat.read(course.execute(source, tmp_path / "out"), as_version=4)
    assert executed.cells[0].outputs[0]["text"].split()[0] == "ipc"
    assert "without encryption" not in capfd.readouterr().err  # ipykernel's warning about plain TCP
