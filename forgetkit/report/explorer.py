"""The sample explorer: every sample of a run (and of its training run) with its image or
text, labels by class name and trajectory, in one offline HTML fragment.

The data travels as one JSON record (names, galleries, texts) and one zlib-compressed binary
blob (per-sample columns, trajectories and thumbnails), base64 in the page and decoded by the
inline script (``explorer.js``) with the browser's DecompressionStream. Hooks for tests and
links: the card is ``[data-testid=sample-card]`` with ``data-run`` and ``data-sample-id``;
gallery items are ``[data-testid=gallery-item]`` with ``data-sample-id``; the fragment
``#train-123`` / ``#test-45`` opens that card.
"""

from __future__ import annotations

import base64
import html
import json
import math
import zlib
from importlib import resources

import numpy as np

from .._validation import check_int, check_path, check_type
from ..analysis.dynamics import data_map
from ..analysis.label_issues import label_issues
from ..errors import ForgetkitError
from ..run import check_run
from . import plots
from .inputs import input_rows, load_inputs, parse_class_names

#: Raw bytes of all thumbnails together; their side shrinks to stay within it.
THUMB_BUDGET = 14_000_000
#: Largest thumbnail side (pixels).
MAX_THUMB = 48
#: Side of the larger images a card shows when thumbnails are smaller (pixels).
CARD_SIDE = 96
#: Raw bytes of larger images per run, for the first SHARP_PER_GALLERY items of each gallery.
SHARP_BUDGET = 2_000_000
SHARP_PER_GALLERY = 240
#: Values per trajectory (samples x epochs) kept per run; more epochs are strided.
TRAJ_BUDGET = 6_000_000
#: Gallery items stored per gallery (the page shows them a page at a time).
GALLERY_MAX = 2000
#: Characters of a text kept for its card.
TEXT_MAX = 2000
REGIONS = ("easy-to-learn", "ambiguous", "hard-to-learn")


def prepare(run, *, train_run=None, inputs=None, train_inputs=None, class_names=None):
    """Check and load what the explorer shows, before any other work. Returns (run,
    train_run, inputs, train_inputs) with the class names applied to both runs and the
    inputs loaded (`forgetkit.report.inputs.load_inputs`). Raises ForgetkitError on inputs
    with fewer rows than a run's largest sample id, images of another shape, class names of
    the wrong count, or runs of different class counts."""
    check_run("run", run)
    if train_run is not None:
        check_run("train_run", train_run)
    if train_run is not None and train_run.n_classes != run.n_classes:
        raise ForgetkitError(f"train_run has {train_run.n_classes} classes; the run has "
                             f"{run.n_classes}")
    if train_inputs is not None and train_run is None:
        raise ForgetkitError("train_inputs needs a train_run (the training samples' outputs)")
    names = parse_class_names(class_names, run.n_classes, run_names=run.class_names or (
        None if train_run is None else train_run.class_names))
    inputs = load_inputs(inputs, name="inputs")
    train_inputs = load_inputs(train_inputs, name="train_inputs")
    pairs = [(run, inputs, "inputs"), (train_run, train_inputs, "train_inputs")]
    for r, given, what in pairs:
        if r is not None and given is not None:
            input_rows(r, given, name=what)
    if inputs is not None and train_inputs is not None and inputs.kind == train_inputs.kind \
            == "images" and inputs.data.shape[1:] != train_inputs.data.shape[1:]:
        raise ForgetkitError(f"train_inputs images have shape {train_inputs.data.shape[1:]}; "
                             f"inputs have {inputs.data.shape[1:]}")
    if names is not None:
        if run.class_names != names:
            run = run.replace(class_names=names)
        if train_run is not None and train_run.class_names != names:
            train_run = train_run.replace(class_names=names)
    return run, train_run, inputs, train_inputs


def _to_uint8(images):
    if images.dtype == np.uint8:
        return images
    lo, hi = float(np.nanmin(images)), float(np.nanmax(images))
    if lo >= 0 and hi <= 1:
        lo, hi = 0.0, 1.0
    scaled = (np.nan_to_num(images.astype(np.float64), nan=lo) - lo) / max(hi - lo, 1e-12)
    return np.clip(np.rint(scaled * 255), 0, 255).astype(np.uint8)


def _box_weights(n_in, n_out):
    """(n_out, n_in) weights of an area-averaging resample."""
    edges = np.linspace(0, n_in, n_out + 1)
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        a, b = edges[i], edges[i + 1]
        for j in range(int(a), min(math.ceil(b), n_in)):
            w[i, j] = min(b, j + 1) - max(a, j)
        w[i] /= w[i].sum()
    return w


def thumbnails(images, side):
    """Images (n, h, w[, 3]) as uint8 thumbnails fitting a side x side box (aspect kept;
    area-averaged). Returns ndarray (n, th, tw, channels)."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    n, h, w, c = images.shape
    f = min(1.0, side / max(h, w))
    th, tw = max(1, round(h * f)), max(1, round(w * f))
    if (th, tw) == (h, w):
        return _to_uint8(images)
    wy, wx = _box_weights(h, th), _box_weights(w, tw)
    out = np.empty((n, th, tw, c), np.uint8)
    for start in range(0, n, 4096):
        block = _to_uint8(images[start:start + 4096]).astype(np.float32)
        small = np.einsum("sh,nhwc,tw->nstc", wy, block, wx, optimize=True)
        out[start:start + 4096] = np.clip(np.rint(small), 0, 255)
    return out


def thumb_side(n_images, shape):
    """The thumbnail side for ``n_images`` images of ``shape`` (h, w[, 3]) within
    THUMB_BUDGET, at most MAX_THUMB and the images' own size."""
    channels = shape[2] if len(shape) == 3 else 1
    fit = int(math.sqrt(THUMB_BUDGET / max(1, n_images * channels)))
    return max(4, min(MAX_THUMB, max(shape[0], shape[1]), fit))


class _Blob:
    """Arrays packed one after another (each 4-byte aligned) into one buffer."""

    def __init__(self):
        self.parts, self.size = [], 0

    def add(self, arr):
        data = np.ascontiguousarray(arr).tobytes()
        offset = self.size
        self.parts.append(data)
        pad = (-len(data)) % 4
        if pad:
            self.parts.append(b"\0" * pad)
        self.size += len(data) + pad
        return [offset, int(np.asarray(arr).size), np.asarray(arr).dtype.name]

    def encoded(self):
        return base64.b64encode(zlib.compress(b"".join(self.parts), 6)).decode("ascii")


def _class_dtype(n_classes):
    return np.uint8 if n_classes <= 255 else np.uint16 if n_classes <= 65535 else np.int32


def _run_record(run, inputs, blob, *, role, side):
    """The JSON record of one run; its arrays go to ``blob``."""
    n, e = run.n_samples, run.n_epochs
    cdt = _class_dtype(run.n_classes)
    preds = np.asarray(run.predictions())  # (E, N)
    correct = preds == run.labels[None, :]
    probs = np.asarray(run.label_probs())  # (N, E)
    dm = data_map(run)
    issues = label_issues(run)
    ever = correct.any(axis=0)
    # last epoch index at which each sample was right (-1: never)
    last_right = np.where(ever, e - 1 - np.argmax(correct[::-1], axis=0), -1)
    forgotten = ever & ~correct[-1]
    events = (correct[:-1] & ~correct[1:]).sum(axis=0) if e > 1 else np.zeros(n, int)
    stride = max(1, math.ceil(n * e / TRAJ_BUDGET))
    kept = np.arange(e - 1, -1, -stride)[::-1]  # always keeps the final epoch
    cols = {
        "label": blob.add(run.labels.astype(cdt)),
        "pred": blob.add(preds[-1].astype(cdt)),
        "suggested": blob.add(issues["suggested_label"].to_numpy().astype(cdt)),
        "score": blob.add(issues["score"].to_numpy().astype(np.float32)),
        "issue": blob.add(issues["is_issue"].to_numpy().astype(np.uint8)),
        "confidence": blob.add(dm["confidence"].to_numpy().astype(np.float32)),
        "variability": blob.add(dm["variability"].to_numpy().astype(np.float32)),
        "correctness": blob.add(dm["correctness"].to_numpy().astype(np.float32)),
        "region": blob.add(dm["region"].map(REGIONS.index).to_numpy().astype(np.uint8)),
        "events": blob.add(np.minimum(events, 65535).astype(np.uint16)),
        "last_right": blob.add(last_right.astype(np.int32)),
        "traj_p": blob.add(np.rint(np.clip(probs[:, kept], 0, 1) * 255).astype(np.uint8)),
        "traj_pred": blob.add(np.ascontiguousarray(preds[kept].T).astype(cdt)),
    }
    ids = None
    if run.sample_ids is not None and not np.array_equal(run.sample_ids, np.arange(n)):
        ids = [x.item() if isinstance(x, np.generic) else str(x) for x in run.sample_ids]
    record = {"role": role, "n": n, "epochs": [int(x) for x in run.epochs],
              "traj_epochs": [int(run.epochs[i]) for i in kept], "ids": ids, "cols": cols,
              "kind": None}
    gal = []
    order = np.lexsort((np.arange(n), -last_right))  # latest forgotten first
    gal.append({"key": "forgotten", "title": "Forgotten: right at some epoch, wrong at the end",
                "items": [int(i) for i in order[forgotten[order]][:GALLERY_MAX]],
                "total": int(forgotten.sum())})
    score = issues["score"].to_numpy()
    flagged = np.flatnonzero(issues["is_issue"].to_numpy())
    flagged = flagged[np.argsort(-score[flagged], kind="stable")]
    gal.append({"key": "suspicious", "title": "Most suspicious labels (confident learning)",
                "items": [int(i) for i in flagged[:GALLERY_MAX]], "total": int(flagged.size)})
    never = np.flatnonzero(~ever)
    gal.append({"key": "never", "title": "Never learned: wrong at every epoch",
                "items": [int(i) for i in never[:GALLERY_MAX]], "total": int(never.size)})
    record["galleries"] = gal
    if inputs is not None:
        rows = input_rows(run, inputs)
        if inputs.kind == "images":
            small = thumbnails(inputs.data[rows], side)
            record.update(kind="images", thumb=list(small.shape[1:]),
                          thumbs=blob.add(small))
            record["sharp"] = _sharp_images(inputs.data, rows, gal, small.shape[1:3])
            if record["sharp"] is not None:
                record["sharp"]["data"] = blob.add(record["sharp"].pop("images"))
        else:
            record.update(kind="texts", texts=[_clip(inputs.data[r]) for r in rows])
    return record


def _sharp_images(images, rows, galleries, thumb_shape):
    """Larger images (up to CARD_SIDE) for the cards of the galleries' first items, when the
    thumbnails are smaller than that: {"index": sample positions, "shape", "images"}, or
    None."""
    shape = images.shape[1:]
    side = min(CARD_SIDE, max(shape[0], shape[1]))
    if max(thumb_shape) >= side:
        return None
    per_image = side * side * (shape[2] if len(shape) == 3 else 1)
    count = max(0, SHARP_BUDGET // per_image)
    heads = [i for g in galleries for i in g["items"][:SHARP_PER_GALLERY]]
    index = list(dict.fromkeys(heads))[:count]  # in gallery order, without repeats
    if not index:
        return None
    big = thumbnails(images[rows[np.asarray(index)]], side)
    return {"index": index, "shape": list(big.shape[1:]), "images": big}


def _clip(text):
    return text if len(text) <= TEXT_MAX else text[:TEXT_MAX] + "…"


def payload(run, *, train_run=None, inputs=None, train_inputs=None):
    """The explorer's JSON record and each run's encoded blob ({"test": str, "train": str})
    for runs already `prepare`d."""
    names = plots.class_names(run)
    n_images = sum(r.n_samples for r, i in ((run, inputs), (train_run, train_inputs))
                   if r is not None and i is not None and i.kind == "images")
    shape = next((i.data.shape[1:] for i in (inputs, train_inputs)
                  if i is not None and i.kind == "images"), (1, 1))
    side = thumb_side(n_images, shape)
    runs, blobs = {}, {}
    for role, r, given in (("test", run, inputs), ("train", train_run, train_inputs)):
        if r is not None:
            blob = _Blob()
            runs[role] = _run_record(r, given, blob, role=role, side=side)
            blobs[role] = blob.encoded()
    return {"classes": names, "runs": runs}, blobs


def _script_json(obj):
    """JSON safe inside a <script> element: no '<' (so no '</script>' or '<!--') survives."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _asset(name):
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def fragment(run, *, train_run=None, inputs=None, train_inputs=None):
    """The explorer as an HTML fragment (a section, its style and its inline script) for runs
    and inputs already `prepare`d."""
    record, blobs = payload(run, train_run=train_run, inputs=inputs,
                            train_inputs=train_inputs)
    # the script comes right after the test run's data: it shows the test run (and opens a
    # #test-N card) while the browser still parses the larger training run's data
    return "".join([
        f"<style>{_asset('explorer.css')}</style>",
        "<section id='fk-explorer' class='fk-explorer'><h2>Samples</h2>",
        "<p class='fk-loading'>Loading the samples…</p></section>",
        f"<script type='application/json' id='fk-data'>{_script_json(record)}</script>",
        _blob_elements("test", blobs["test"]),
        f"<script>{_asset('explorer.js')}</script>",
        "".join(_blob_elements(role, b) for role, b in blobs.items() if role != "test"),
    ])


#: Base64 characters per element of a run's data (a multiple of 4): the browser parses the
#: page between elements, so it can paint and answer while the rest of the data arrives.
BLOB_PIECE = 1 << 20


def _blob_elements(role, text):
    return "".join(f"<script type='text/plain' class='fk-blob-{role}'>"
                   f"{text[i:i + BLOB_PIECE]}</script>"
                   for i in range(0, max(len(text), 1), BLOB_PIECE))


def page(run, *, train_run=None, inputs=None, train_inputs=None, title="forgetkit samples"):
    """A whole HTML document holding only the explorer."""
    return "".join([
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title></head><body class='fk-page'>",
        fragment(run, train_run=train_run, inputs=inputs, train_inputs=train_inputs),
        "</body></html>"])


class Explorer:
    """The sample explorer of a run, shown inline by Jupyter (an iframe holding the page).

    Attributes
    ----------
    html : str
        The whole HTML document; `save` writes it.
    """

    def __init__(self, html_text, *, height=900):
        self.html = check_type("html_text", html_text, str, "the explorer's HTML text (str)")
        self.height = check_int("height", height, minimum=1)

    def _repr_html_(self):
        return (f"<iframe srcdoc=\"{html.escape(self.html, quote=True)}\" "
                f"style='width:100%;height:{self.height}px;border:1px solid #ddd' "
                "sandbox='allow-scripts'></iframe>")

    def save(self, path):
        """Write the explorer to ``path`` (one offline HTML file). Returns the path."""
        from pathlib import Path

        from ..io.atomic import atomic_write

        path = Path(check_path("path", path))
        with atomic_write(path) as tmp:
            tmp.write_text(self.html, encoding="utf-8")
        return path


def explore(run, *, train_run=None, inputs=None, train_inputs=None, class_names=None,
            height=900):
    """The sample explorer of ``run`` (and ``train_run``) for a notebook.

    Parameters
    ----------
    run : Run
        Usually the test run.
    train_run : Run, optional
        The training-set run.
    inputs, train_inputs : ndarray, list of str, str or Path, optional
        The samples behind each run's rows (`forgetkit.report.inputs.load_inputs`): row i is
        sample id i, or row i when the run has no ids.
    class_names : sequence of str, str or Path, optional
        Names of the classes (default: the run's own).
    height : int
        Height of the inline frame in pixels.

    Returns
    -------
    Explorer
        Shown by Jupyter; ``.save(path)`` writes it as one HTML file.
    """
    run, train_run, inputs, train_inputs = prepare(
        run, train_run=train_run, inputs=inputs, train_inputs=train_inputs,
        class_names=class_names)
    return Explorer(page(run, train_run=train_run, inputs=inputs, train_inputs=train_inputs),
                    height=height)
