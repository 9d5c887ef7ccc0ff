"""The pieces every report page shares: figures rendered to PNG and embedded, and the base
style."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass


@dataclass
class Figure:
    name: str
    title: str
    caption: str
    png: bytes


def render(draw, figsize=(7.0, 4.2)):
    """PNG bytes of a figure whose one Axes ``draw(ax)`` fills."""
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=figsize, layout="constrained")
    draw(fig.add_subplot())
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def figure_html(fig):
    """A `Figure` as an HTML figure element, the PNG inline."""
    data = base64.b64encode(fig.png).decode()
    return (f"<figure id='{fig.name}'><h3>{html.escape(fig.title)}</h3>"
            f"<img alt='{html.escape(fig.title)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(fig.caption)}</figcaption></figure>")


STYLE = """body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222;
line-height:1.45}h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;
text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#444;font-size:.95em}
.numbers td:first-child{font-weight:600}details.meta td{text-align:left}
details.meta summary{cursor:pointer;color:#444}"""
