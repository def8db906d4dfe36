"""Figures on log axes: a line's label sits at its line, not orders of magnitude beyond the data."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from kvlab import loadtest, prefill_decode, slo
from kvlab.runtime import figures


def test_a_label_on_a_log_axis_is_placed_at_log10_once():
    fig = go.Figure(go.Scatter(x=[1, 10], y=[10, 1000]))
    fig.add_hline(y=500, annotation_text="SLO 500 ms")
    fig.add_vline(x=4, annotation_text="knee")
    fig.update_layout(yaxis_type="log")
    figures.place_on_log_axes(figures.place_on_log_axes(fig))  # twice: converted once
    hline, vline = fig.layout.annotations
    assert math.isclose(hline.y, math.log10(500)) and vline.x == 4  # the x axis is linear: left alone


def test_lesson_figures_keep_their_labels_within_the_data():
    table = pd.DataFrame({"rate_rps": [0.5, 1.0, 2.0], "throughput_rps": [0.5, 1.0, 1.4], "goodput_rps": [0.5, 0.9, 0.2],
                          "ttft_p50_ms": [200, 300, 4000], "ttft_p95_ms": [300, 500, 9000], "tpot_p95_ms": [40, 60, 90]})
    objective = slo.SLO(ttft_ms=800, tpot_ms=80)
    fig = loadtest.rate_sweep_figure(table, objective, 1.0, {"rate": 1.2, "at_least": False})
    ys = [a.y for a in fig.layout.annotations if a.text and "SLO" in a.text]
    assert ys and all(1 < y < 5 for y in ys), ys  # log10 of 80 and 800 ms, not 80 and 800
    medians = pd.DataFrame({"prompt_tokens": [64, 512, 4096], "prefill_s": [0.05, 0.4, 4.0], "tpot_s": [0.05, 0.05, 0.06]})
    fig = prefill_decode.crossover_plot(medians, [16], {16: 600.0})
    xs = [a.x for a in fig.layout.annotations if a.text and "crossover" in a.text]
    assert xs == [math.log10(600.0)]


def test_a_label_in_the_wrong_units_is_caught_and_a_right_one_is_not():
    fig = go.Figure(go.Scatter(x=[1, 10], y=[10, 1000]))
    fig.add_hline(y=500, annotation_text="SLO 500 ms")
    fig.update_layout(yaxis_type="log")
    problems = figures.overreach(fig)  # 500 read as 10^500
    assert len(problems) == 1 and "SLO 500 ms" in problems[0] and "10^500" in problems[0], problems
    assert figures.overreach(figures.place_on_log_axes(fig)) == []
    linear = go.Figure(go.Scatter(x=[0, 1], y=[0.2, 0.9]))
    linear.update_layout(yaxis_range=[0, 1.05])
    assert figures.overreach(linear) == []
    linear.update_layout(xaxis_range=[0, 1e6])
    assert figures.overreach(linear) == ["the x axis range at 1e+06 on an axis whose data span 0–1"]


def test_the_build_flags_a_notebook_whose_figure_overreaches(tmp_path):
    import nbformat

    from kvlab.course import build

    fig = go.Figure(go.Scatter(x=[1, 10], y=[10, 1000]))
    fig.add_hline(y=500, annotation_text="SLO")
    fig.update_layout(yaxis_type="log")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("fig", outputs=[nbformat.v4.new_output(
        "display_data", data={"application/vnd.plotly.v1+json": fig.to_plotly_json()})])])
    path = tmp_path / "nb.ipynb"
    path.write_text(nbformat.writes(nb))
    assert [p.split(":")[0] for p in build.figure_problems(path)] == ["cell 0"]


def test_figures_read_back_from_a_notebook_are_checked_on_all_their_data():
    """An executed notebook holds numpy coordinates as base64 (``bdata``): they count as data. Lesson 02's TTFT plot
    (prompts 128-4,096 as numpy, a ridge marker at 32 as a list) was flagged when only the list was read."""
    import json

    import numpy as np
    import plotly.io as pio

    fig = go.Figure(go.Scatter(x=np.array([128, 1024, 4096], dtype="int16"), y=np.array([0.1, 0.8, 6.0])))
    fig.add_scatter(x=[32, 32], y=[0.1, 6.0])
    fig.update_layout(xaxis_type="log", xaxis_range=[1.33, 3.79])
    back = pio.from_json(json.dumps(json.loads(pio.to_json(fig))))
    assert isinstance(back.data[0].x, dict) and "bdata" in back.data[0].x  # what the build reads
    assert figures._numbers(back.data[0].x) == [128.0, 1024.0, 4096.0]
    assert figures.overreach(back) == []
    back.update_layout(xaxis_range=[1.33, 9.0])
    assert len(figures.overreach(back)) == 1


def test_lesson_07s_mitigations_plot_puts_its_slo_label_on_the_log_axis():
    from types import SimpleNamespace

    from kvlab import loadtest

    table = pd.DataFrame({"setting": ["shared", "priority"], "chat TTFT p95 (ms)": [900.0, 300.0], "batch tokens/s": [50.0, 40.0]})
    fig = loadtest.mitigations(table, SimpleNamespace(percentile=95, ttft_ms=400.0))
    assert figures.overreach(fig) == [], figures.overreach(fig)
    assert [a.y for a in fig.layout.annotations if a.text == "TTFT SLO"] == [math.log10(400.0)]
