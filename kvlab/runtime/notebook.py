"""Notebook set-up: one-sentence errors and figures that render offline and in the built HTML pages."""

from __future__ import annotations

from kvlab.runtime.errors import show_short_errors


def setup_notebook() -> None:
    """First call of every notebook: one-sentence errors and plots that render offline and in HTML."""
    show_short_errors()
    use_offline_renderer()


def use_offline_renderer() -> None:
    """Figures embed plotly.js inline, so executed notebooks and their HTML pages work offline."""
    import plotly.io as pio

    pio.renderers.default = "notebook+plotly_mimetype"
