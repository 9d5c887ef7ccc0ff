"""The code of the guides runs, so it cannot drift from the library.

Every ```python block of README.md and of the guides in docs/ is executed, in page order and
in one namespace per page, from a temporary folder in which ``data_samples/`` is the
repository's. A block preceded by the line ``<!-- not run: REASON -->`` is not executed (it
needs a GPU, a cluster, a framework's trainer...); test_api_docs.py checks its calls of the
public API against the real signatures, as it does every block's. The names a page leaves to
the reader (``model``, ``test_loader``, ...) are given by `STAND_INS`: small real objects
(a linear model, a loader of random inputs), never mocks of forgetkit.
"""

from __future__ import annotations

import re

import matplotlib
import pytest

from .conftest import ROOT, require_real_part
from .test_api_docs import DOCS, prose

matplotlib.use("Agg")

NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
BLOCK = re.compile(r"^(?:(<!--.*?-->)\n)?```python\n(.*?)^```", re.S | re.M)


#: The README's tour (the block right under "## Python"), which tests/test_fuser_api.py runs
#: (and finds by that heading, so it carries no marker).
TOUR = "\n## Python\n\n"


def blocks(text):
    """(line, code, reason, comment) of each Python block: reason is None for a block that
    runs here; comment, the HTML comment on the line before the block, if any."""
    out = []
    for m in BLOCK.finditer(text):
        comment = m.group(1)
        not_run = comment and NOT_RUN.fullmatch(comment)
        reason = not_run.group(1) if not_run else \
            "run by tests/test_fuser_api.py" if text[:m.start()].endswith(TOUR) else None
        out.append((text.count("\n", 0, m.start(2)) + 1, m.group(2), reason, comment))
    return out


# ------------------------------------------------------------- the reader's names
def _linear_training(ns):
    """A linear classifier of 8 features into 4 classes, its training step and a loader of
    256 samples: what the PyTorch recording blocks assume the reader has."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 8, generator=g), torch.randint(0, 4, (256,), generator=g)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def train_one_epoch(model):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    ns.update(model=model, train_one_epoch=train_one_epoch, epochs=3,
              test_loader=DataLoader(TensorDataset(x, y), batch_size=64), x=x, y=y)


def _saved_checkpoints(ns):
    """`_linear_training`'s model saved after each of 3 epochs as ckpts/model_{epoch}.pt, and
    its data as ``test_images``, ``test_labels``."""
    import os

    import torch

    _linear_training(ns)
    os.makedirs("ckpts")
    for epoch in range(3):
        ns["train_one_epoch"](ns["model"])
        torch.save(ns["model"].state_dict(), f"ckpts/model_{epoch}.pt")
    ns.update(test_images=ns["x"], test_labels=ns["y"])


def _causal_lm(ns):
    """A bigram language model over 32 tokens (an embedding and a linear head, called like a
    Hugging Face model), its training step and 8 dict batches of sequences of 12 tokens."""
    import torch

    class Bigram(torch.nn.Module):
        def __init__(self, vocab=32, width=16):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.head = torch.nn.Linear(width, vocab)

        def forward(self, input_ids, attention_mask=None):
            return self.head(self.embed(input_ids))

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (32, 12), generator=g)
    model = Bigram()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def train_step(model):
        optimizer.zero_grad()
        logits = model(ids[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 32), ids[:, 1:].reshape(-1)).backward()
        optimizer.step()

    ns.update(model=model, train_step=train_step, steps=201,
              eval_loader=[{"input_ids": ids[i:i + 4], "attention_mask": torch.ones(4, 12),
                            "labels": ids[i:i + 4]} for i in range(0, 32, 4)])


#: The optional extras a page's code may import (module -> what to install): without one the
#: page's test is skipped, and fails on CI, as the recorder tests are.
EXTRAS = {"torch": "PyTorch (pip install forgetkit[torch])",
          "dask": "dask (pip install 'forgetkit[dask]')",
          "distributed": "dask's distributed (pip install 'forgetkit[dask]')"}

#: page name -> the function giving the names its blocks leave to the reader.
STAND_INS = {"README.md": _linear_training, "recording.md": _linear_training,
             "replay.md": _saved_checkpoints, "language-models.md": _causal_lm}


# ---------------------------------------------------------------------- the tests
def _runs(doc):
    """(line, code) of the page's blocks that run here."""
    return [(line, code) for line, code, reason, _ in blocks(doc.read_text()) if reason is None]


def test_the_not_run_markers_are_well_formed_and_most_blocks_run():
    """A comment right before a block is a ``<!-- not run: REASON -->`` marker, every such
    marker stands right before a block, and most blocks run."""
    found = {doc.name: blocks(doc.read_text()) for doc in DOCS}
    for doc in DOCS:
        for line, _, _, comment in found[doc.name]:
            assert comment is None or NOT_RUN.fullmatch(comment), \
                f"{doc.name}:{line}: the comment before a block must be " \
                f"<!-- not run: REASON -->; got {comment!r}"
        markers = len(re.findall(r"<!-- not run", doc.read_text()))
        assert markers == sum(c is not None for *_, c in found[doc.name]), \
            f"{doc.name}: a '<!-- not run' marker that does not stand right before a block"
    reasons = [reason for page in found.values() for _, _, reason, _ in page]
    ran, not_run = reasons.count(None), len(reasons) - reasons.count(None)
    assert ran >= 15 and ran > 2 * not_run, found


@pytest.mark.parametrize("doc", [d for d in DOCS if _runs(d)], ids=lambda d: d.name)
def test_the_page_code_runs(doc, tmp_path, monkeypatch):
    """Run the page's blocks in order, in one namespace, from a folder holding only
    ``data_samples`` (the README's tour, run by test_fuser_api.py, is left out here)."""
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data_samples").symlink_to(ROOT / "data_samples")
    ns = {"__name__": f"guide_{doc.stem}"}
    try:
        STAND_INS.get(doc.name, lambda ns: None)(ns)
        for line, code in _runs(doc):
            exec(compile(code, f"{doc.relative_to(ROOT)}:{line}", "exec"), ns)
    except ModuleNotFoundError as err:
        if err.name not in EXTRAS:
            raise
        require_real_part(EXTRAS[err.name], False)
    finally:
        plt.close("all")


# ------------------------------------------------------------------------- links
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(text):
    """The anchors GitHub gives a page's headings."""
    headings = re.findall(r"^#+ (.+)$", prose(text), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", [*DOCS, ROOT / "docs" / "api.md",
                                 ROOT / "docs" / "definitions.md"], ids=lambda d: d.name)
def test_relative_links_and_their_anchors_resolve(doc):
    """Every relative link names a file of the repository (never a path outside it) and,
    with ``#anchor``, a heading of that page."""
    for link in LINK.findall(prose(doc.read_text())):
        if "://" in link or link.startswith("mailto:"):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        assert target.is_relative_to(ROOT) and target.exists(), f"{doc.name}: {link}"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target.read_text()), f"{doc.name}: {link}"
