"""What a person reads: the paper's figures (``plots``), the self-contained HTML report
(``html``) and its sample explorer (``explorer``: the images or texts behind every point,
also inline in notebooks through `explore`)."""

from . import plots
from .explorer import Explorer, explore
from .html import build, to_html, write_report

__all__ = ["Explorer", "build", "explore", "plots", "to_html", "write_report"]
