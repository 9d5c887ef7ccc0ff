"""What a person reads: the paper's figures (``plots``) and the self-contained HTML report
(``html``)."""

from . import plots
from .html import build, to_html, write_report

__all__ = ["build", "plots", "to_html", "write_report"]
