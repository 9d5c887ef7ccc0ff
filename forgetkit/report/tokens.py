"""The report of a token run: a language model's next-token targets, shown as text.

A token run (one sample per stored target token, a vocabulary as classes) is not read like an
image classifier: its report has no label issues, no image data map and no per-class figures.
It shows, over the checkpoints, the mean surprisal (the loss), next-token accuracy, the forget
and learn fractions F_e and L_e and memorization; Knowledge Fusion's certified accuracy beside
the final checkpoint's; and the sequences as text, each stored target coloured by its fate:

- ``always``: correct at every checkpoint;
- ``learned``: correct at the last checkpoint, not at every one;
- ``forgotten``: correct at some checkpoint, wrong at the last;
- ``never``: correct at none.

Hovering or focusing a token shows its target's probability over the checkpoints and the top
predictions of the last checkpoint, decoded by the run's tokenizer. Stable hooks for tests
and links: ``[data-testid=sequence]`` with ``data-sequence-id``, ``[data-testid=token]`` with
``data-sequence-id``, ``data-position`` and ``data-fate``; the fragment ``#seq-<id>`` shows
that sequence.
"""

from __future__ import annotations

import base64
import html
import json
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .. import evaluate
from ..analysis import forgetting, tokens
from ..errors import ForgetkitError
from ..evaluate import percent
from .page import STYLE as BASE_STYLE
from .page import Figure, figure_html, render

#: Runs up to this many tokens show every sequence; larger ones the galleries' sequences and
#: those asked for (``sequences=``), so that a report of millions of tokens stays small.
ALL_SEQUENCES_MAX_TOKENS = 100_000
#: Sequences per gallery.
GALLERY_SIZE = 12
#: Top predictions of the last checkpoint shown per token.
TOP_SHOWN = 5
#: The shortest run of consecutive targets, all correct at the last checkpoint, that the
#: memorized-spans gallery shows.
MIN_SPAN = 8
FATES = ("always", "learned", "forgotten", "never")


def is_token_run(run):
    """Whether ``run`` is a token run: it holds each target's sequence id and position."""
    return run.sequence_ids is not None and run.positions is not None


# ------------------------------------------------------------------ tokenizer
class Decoder:
    """Token ids -> text, by a ``tokenizers`` JSON file or a Hugging Face tokenizer folder.

    ``texts(ids)``: the decoding of each id alone (a list of str). Without a tokenizer
    (``Decoder(None)``) an id shows as ``⟨id⟩``.
    """

    def __init__(self, tokenizer, source=None):
        self._tokenizer = tokenizer
        self.source = source

    def texts(self, ids):
        ids = [int(i) for i in ids]
        if self._tokenizer is None:
            return [f"⟨{i}⟩" for i in ids]
        return [self._tokenizer.decode([i]) for i in ids]


def _read_tokenizer(path):
    """The tokenizer at ``path``: a ``tokenizers`` JSON file, or a folder holding
    tokenizer.json (else one transformers can read with AutoTokenizer, locally)."""
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            path = path / "tokenizer.json"
        else:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise ForgetkitError(f"tokenizer folder {path} has no tokenizer.json; reading "
                                     "it needs transformers (pip install transformers)") from exc
            try:
                return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            except Exception as exc:  # transformers' errors vary by version
                raise ForgetkitError(f"cannot read the tokenizer folder {path}: {exc}") from exc
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ForgetkitError("showing tokens as text needs the tokenizers package "
                             "(pip install tokenizers)") from exc
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type on a bad file
        raise ForgetkitError(f"cannot read the tokenizer file {path}: {exc}") from exc


def load_decoder(tokenizer, run):
    """The `Decoder` of a token run's report.

    ``tokenizer``: a path (a ``tokenizers`` JSON file or a Hugging Face tokenizer folder), an
    object with ``decode(list_of_ids)``, or None: the tokenizer the run's metadata names
    (``meta["tokenizer"]``, relative to the run's file), or no tokenizer (ids shown as
    ``⟨id⟩``) when it names none.
    """
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        return Decoder(tokenizer, type(tokenizer).__name__)
    if tokenizer is None:
        named = (run.meta or {}).get("tokenizer")
        if not isinstance(named, str) or not named:
            return Decoder(None)
        base = Path(run.source).parent if run.source is not None else Path(".")
        path = base / named
        if not path.exists():
            raise ForgetkitError(f"the run's metadata names the tokenizer {named!r}, which is "
                                 f"not at {path}; pass the tokenizer's file or folder "
                                 "(--tokenizer)")
    else:
        if not isinstance(tokenizer, (str, Path)):
            raise ForgetkitError(f"tokenizer must be a path to a tokenizers JSON file or a "
                                 f"tokenizer folder, or an object with decode(); got "
                                 f"{type(tokenizer).__name__}")
        path = Path(tokenizer)
        if not path.exists():
            raise ForgetkitError(f"tokenizer {str(path)!r} does not exist")
    return Decoder(_read_tokenizer(path), path.name)


# ------------------------------------------------------------------ what the report shows
@dataclass
class TokenReport:
    """Everything a token run's report shows (`build_tokens`)."""

    numbers: list  # (name, text) rows of the summary table
    curves: object  # DataFrame, one row per checkpoint
    table: object  # `forgetkit.compare`'s table (certified accuracy intervals)
    figures: list  # of `forgetkit.report.html.Figure`
    fates: np.ndarray  # int8 (N,): index into FATES
    shown: np.ndarray  # sorted ids of the sequences shown
    galleries: dict  # title -> list of (sequence id, caption, (first, last) token rows)
    n_sequences: int


def token_fates(correct):
    """Each token's fate (index into ``FATES``) from its correctness bool (E, N): int8 (N,)."""
    last = correct[-1]
    every, ever = correct.all(axis=0), correct.any(axis=0)
    fates = np.full(correct.shape[1], FATES.index("never"), dtype=np.int8)
    fates[ever & ~last] = FATES.index("forgotten")
    fates[last & ~every] = FATES.index("learned")
    fates[every] = FATES.index("always")
    return fates


def memorized_runs(seq_codes, positions, correct_last, *, min_length=MIN_SPAN):
    """Maximal runs of tokens at consecutive positions of one sequence whose targets are all
    correct at the last checkpoint, at least ``min_length`` long. Inputs in token order
    sorted by (sequence, position). Returns int64 (J, 2): first and last token row."""
    n = len(seq_codes)
    if n == 0:
        return np.empty((0, 2), dtype=np.int64)
    joined = (np.diff(seq_codes) == 0) & (np.diff(positions) == 1) \
        & correct_last[1:] & correct_last[:-1]
    starts = np.flatnonzero(np.concatenate([[True], ~joined]))
    ends = np.concatenate([starts[1:] - 1, [n - 1]])
    keep = correct_last[starts] & (ends - starts + 1 >= min_length)
    return np.column_stack([starts[keep], ends[keep]]).astype(np.int64)


def _figures(curves, table, run):
    from .plots import compare_methods, forget_learn

    def loss_accuracy(ax):
        ax.plot(curves.index, curves["surprisal"], color="C0", label="mean surprisal (loss)")
        ax.set_xlabel("checkpoint")
        ax.set_ylabel("mean surprisal −log p(target) (nats)")
        right = ax.twinx()
        right.plot(curves.index, 100 * curves["accuracy"], color="C1",
                   label="next-token accuracy")
        right.set_ylabel("next-token accuracy (%)")
        ax.set_title("Loss and next-token accuracy")
        lines = ax.get_lines() + right.get_lines()
        ax.legend(lines, [line.get_label() for line in lines], fontsize="small")
        return ax

    def memorization(ax):
        for col, label in (("tokens", "tokens memorized (argmax = target)"),
                           ("sequences", "sequences memorized (every target)"),
                           ("sequences_forgotten", "sequences memorized earlier, not now")):
            ax.plot(curves.index, 100 * curves[col], label=label)
        ax.set_xlabel("checkpoint")
        ax.set_ylabel("share (%)")
        ax.set_title("Memorization")
        ax.legend(fontsize="small")
        return ax

    def forget(ax):
        forget_learn(run, ax=ax)
        ax.set_xlabel("checkpoint")
        ax.set_ylabel("share of target tokens (%)")
        return ax

    best = curves["surprisal"].idxmin()
    kf = table.loc["kf"]
    single = table.loc["single"]
    specs = [
        ("loss_accuracy", "Loss and next-token accuracy", loss_accuracy,
         f"Mean surprisal of the target tokens (blue) and the share predicted as the argmax "
         f"(orange) at each checkpoint. The loss is lowest at checkpoint {best} "
         f"({curves['surprisal'].min():.3f} nats); at the last it is "
         f"{curves['surprisal'].iloc[-1]:.3f}."),
        ("forget_learn", "Forget and learn fractions", forget,
         f"F_e (solid): targets predicted at checkpoint e and not at the last; L_e (dashed): "
         f"the reverse. At most {percent(curves['forget'].max())} of the targets were "
         f"predicted at an earlier checkpoint and are lost at the last."),
        ("memorization", "Memorization", memorization,
         f"Shares of target tokens and of whole sequences the checkpoint predicts exactly. "
         f"{percent(curves['sequences'].iloc[-1])} of the sequences are memorized at the last "
         f"checkpoint; {percent(curves['sequences_forgotten'].iloc[-1])} were memorized at an "
         "earlier one and are not."),
        ("compare", "Knowledge Fusion against the baselines",
         lambda ax: compare_methods(table, ax=ax),
         f"Certified next-token accuracy over the protocol's splits: KF(inf) "
         f"[{kf['accuracy_low']:.2f}, {kf['accuracy_high']:.2f}]% against the last "
         f"checkpoint's {single['accuracy']:.2f}% (a top-k run bounds the probabilities it "
         "did not store, so a fused accuracy is an interval)."),
    ]
    return [Figure(name, title, caption, render(draw)) for name, title, draw, caption in specs]


def build_tokens(run, *, sequences=None, val_frac=0.5, seeds=(0, 1, 2), window=1,
                 progress=False):
    """Compute what a token run's report shows (see the module docstring).

    Parameters
    ----------
    run : Run
        A token run that holds each token's sequence id and position (a top-k run does).
    sequences : array-like of int, optional
        Sequence ids shown beside the galleries' when the run has more than
        ``ALL_SEQUENCES_MAX_TOKENS`` tokens (smaller runs show every sequence).
    val_frac, seeds, window, progress
        As in `forgetkit.compare`.

    Returns
    -------
    TokenReport
    """
    seq, pos = run.sequence_ids, run.positions
    if seq is None or pos is None:
        raise ForgetkitError("a token report needs each token's sequence id and position, "
                             "which a top-k run holds; this run holds neither")
    correct = run.correctness(progress=progress)
    accuracy = correct.mean(axis=1)
    memo = tokens.memorization(run)
    surprisal = tokens.mean_surprisal(run)
    curves = memo.assign(surprisal=surprisal, accuracy=accuracy,
                         forget=forgetting.forget_fraction(run),
                         learn=forgetting.learn_fraction(run))
    table = evaluate.compare(run, seeds=seeds, val_frac=val_frac, window=window,
                             progress=progress)
    fates = token_fates(correct)

    order = np.lexsort((pos, seq))
    ids, codes = np.unique(seq, return_inverse=True)
    forgotten = np.bincount(codes, weights=fates == FATES.index("forgotten"),
                            minlength=len(ids))
    most = np.argsort(-forgotten, kind="stable")[:GALLERY_SIZE]
    galleries = {"Sequences with the most forgotten tokens": [
        (int(ids[s]), f"{int(forgotten[s])} forgotten of {int((codes == s).sum())} targets",
         None) for s in most if forgotten[s] > 0]}
    spans = memorized_runs(codes[order], pos[order].astype(np.int64), correct[-1][order])
    longest = spans[np.argsort(-(spans[:, 1] - spans[:, 0]), kind="stable")]
    chosen, seen = [], set()
    for first, last in longest:
        s = int(codes[order[first]])
        if s not in seen:
            seen.add(s)
            chosen.append((int(ids[s]), f"{int(last - first + 1)} targets in a row predicted "
                           "at the last checkpoint", (int(order[first]), int(order[last]))))
        if len(chosen) == GALLERY_SIZE:
            break
    galleries["Memorized spans"] = chosen

    if run.n_samples <= ALL_SEQUENCES_MAX_TOKENS:
        shown = ids
    else:
        wanted = {s for items in galleries.values() for s, _, _ in items}
        if sequences is not None:
            asked = np.asarray(sequences, dtype=np.int64).ravel()
            missing = np.setdiff1d(asked, ids)
            if missing.size:
                raise ForgetkitError(f"sequences: the run holds no sequence {missing[:5].tolist()}")
            wanted.update(asked.tolist())
        shown = np.array(sorted(wanted), dtype=np.int64)

    n_seq = len(ids)
    final_memo = memo["sequences"].iloc[-1]
    kf = table.loc["kf"]
    numbers = [
        ("checkpoints", f"{run.n_epochs} (numbers {run.epochs[0]}..{run.epochs[-1]})"),
        ("target tokens", f"{run.n_samples:,} in {n_seq:,} sequences"),
        ("vocabulary", f"{run.n_classes:,} tokens, top {run.top_k} stored per target"),
        ("mean surprisal at the last checkpoint", f"{surprisal[-1]:.3f} nats"),
        ("next-token accuracy at the last checkpoint", percent(accuracy[-1])),
        ("max forget fraction F_e", f"{percent(curves['forget'].max())} at checkpoint "
                                    f"{curves['forget'].idxmax()}"),
        ("fates of the targets", ", ".join(
            f"{name} {percent(np.mean(fates == i))}" for i, name in enumerate(FATES))),
        ("sequences memorized at the last checkpoint", percent(final_memo)),
        ("KF(inf), certified accuracy", f"[{kf['accuracy_low']:.2f}, "
                                        f"{kf['accuracy_high']:.2f}]% with {kf['k']:.1f} "
                                        f"checkpoints, against "
                                        f"{table.loc['single', 'accuracy']:.2f}% for the last"),
    ]
    return TokenReport(numbers, curves, table, _figures(curves, table, run), fates, shown,
                       galleries, n_seq)


# ------------------------------------------------------------------ HTML
STYLE = """.tok{white-space:pre-wrap;border-radius:2px;cursor:default}
.tok[data-fate=always]{background:#dbeedb}.tok[data-fate=learned]{background:#d6e6f7}
.tok[data-fate=forgotten]{background:#f8cfc9}.tok[data-fate=never]{background:#eeeeee}
.tok:focus,.tok:hover{outline:2px solid #333}
.seq{font-family:ui-monospace,monospace;font-size:.9em;border:1px solid #ddd;padding:.5em;
margin:.5em 0;line-height:1.7}.seq:target{border-color:#c00;box-shadow:0 0 0 2px #fcc}
.seq h4{margin:0 0 .3em;font-family:system-ui,sans-serif}.gap{color:#999}
.legend span{padding:0 .4em;margin-right:.5em}
#tok-tip{position:absolute;display:none;background:#fff;border:1px solid #888;padding:.4em;
font-size:.85em;max-width:24em;box-shadow:0 2px 6px rgba(0,0,0,.2);z-index:10}
.excerpt{font-family:ui-monospace,monospace;white-space:pre-wrap}
.excerpt mark{background:#f8cfc9}"""


def _b64(array):
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()


def _sequence_html(sid, rows, positions, fates, texts):
    parts = [f"<div class='seq' data-testid='sequence' data-sequence-id='{sid}' id='seq-{sid}'>"
             f"<h4>sequence {sid}</h4>"]
    last = None
    for r in rows:
        p = int(positions[r])
        if last is not None and p != last + 1:
            parts.append("<span class='gap'> … </span>")
        last = p
        parts.append(f"<span class='tok' data-testid='token' data-sequence-id='{sid}' "
                     f"data-position='{p}' data-fate='{FATES[fates[r]]}' data-row='{r}' "
                     f"tabindex='0'>{html.escape(texts[r])}</span>")
    parts.append("</div>")
    return "".join(parts)


def token_fragment(run, report, decoder):
    """The sequences section of a token report (HTML), with its data and script: galleries,
    the shown sequences as text, and the per-token details shown on hover or focus."""
    seq, pos = run.sequence_ids, run.positions
    shown_rows = np.flatnonzero(np.isin(seq, report.shown))
    shown_rows = shown_rows[np.lexsort((pos[shown_rows], seq[shown_rows]))]
    label_probs = run.isel(samples=shown_rows).label_probs()  # (shown, E): those only
    top_ids, top_probs = run.outputs.top_predictions(-1, rows=shown_rows, n=TOP_SHOWN)

    vocab_ids = np.unique(np.concatenate([run.labels[shown_rows], top_ids.ravel()]))
    vocab = dict(zip(vocab_ids.tolist(), decoder.texts(vocab_ids), strict=True))
    texts = {int(r): vocab[int(run.labels[r])] for r in shown_rows}

    galleries = []
    for title, items in report.galleries.items():
        cards = []
        for sid, caption, span in items:
            if span is not None:
                a, b = span
                rows = shown_rows[(seq[shown_rows] == sid)
                                  & (pos[shown_rows] >= pos[a]) & (pos[shown_rows] <= pos[b])]
                excerpt = "".join(html.escape(texts[int(r)]) for r in rows)
            else:
                rows = shown_rows[seq[shown_rows] == sid][:40]
                excerpt = "".join(
                    f"<mark>{html.escape(texts[int(r)])}</mark>"
                    if report.fates[r] == FATES.index("forgotten") else html.escape(texts[int(r)])
                    for r in rows)
            cards.append(f"<li data-testid='gallery-sequence' data-sequence-id='{sid}'>"
                         f"<a href='#seq-{sid}'>sequence {sid}</a>: {html.escape(caption)}"
                         f"<div class='excerpt'>{excerpt}</div></li>")
        galleries.append(f"<h3>{html.escape(title)}</h3>"
                         + (f"<ol>{''.join(cards)}</ol>" if cards else "<p>None.</p>"))

    by_seq = {}
    for r in shown_rows:
        by_seq.setdefault(int(seq[r]), []).append(int(r))
    sequences = "".join(_sequence_html(sid, rows, pos, report.fates, texts)
                        for sid, rows in by_seq.items())
    # per shown token (in shown_rows order): p(target) per checkpoint as bytes 0..255, and
    # the top predictions of the last checkpoint (ids, probabilities as bytes)
    quant = np.rint(np.clip(label_probs, 0, 1) * 255).astype(np.uint8)
    data = {
        "epochs": [int(e) for e in run.epochs],
        "rows": _b64(shown_rows.astype("<i4")),
        "p": _b64(quant),
        "topIds": _b64(top_ids.astype("<i4")),
        "topP": _b64(np.rint(np.clip(top_probs, 0, 1) * 255).astype(np.uint8)),
        "top": int(top_ids.shape[1]),
        "vocab": {str(k): v for k, v in vocab.items()},
        "fates": list(FATES),
    }
    script = resources.files(__package__).joinpath("tokens.js").read_text(encoding="utf-8")
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    legend = "".join(f"<span class='tok' data-fate='{f}'>{f}</span>" for f in FATES)
    every = "every sequence" if len(report.shown) == report.n_sequences else (
        f"{len(report.shown)} of {report.n_sequences} sequences (the galleries' and those "
        "asked for)")
    tokenizer = (f"decoded by {html.escape(decoder.source)}" if decoder.source
                 else "shown as ⟨token id⟩: no tokenizer was given or named by the run")
    return "".join([
        "<h2>Sequences</h2>",
        f"<p>Each stored target token, {tokenizer}, coloured by its fate over the "
        f"checkpoints. Hover or focus a token for its probability over the checkpoints and "
        f"the last checkpoint's top predictions. Shown: {every}.</p>",
        f"<p class='legend'>{legend}</p>",
        "".join(galleries),
        "<h3>Sequences as text</h3>",
        sequences,
        "<div id='tok-tip' role='tooltip'></div>",
        f"<script type='application/json' id='tok-data'>{payload}</script>",
        f"<script>{script}</script>",
    ])


def token_html(run, report, decoder, *, source=""):
    """A token run's report as one HTML string (figures inline, no external resources)."""
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>forgetkit token report: {html.escape(source)}</title>",
        f"<style>{BASE_STYLE}{STYLE}</style></head><body>",
        f"<h1>Next-token forgetting and Knowledge Fusion: {html.escape(source)}</h1>",
        f"<p>A language model's run: {run.n_samples:,} target tokens, each a sample; "
        f"{run.n_epochs} checkpoints; a vocabulary of {run.n_classes:,} tokens, of which each "
        f"checkpoint stored the top {run.top_k} per target.</p>",
        "<h2>Summary</h2><table class='numbers'>",
        "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                for k, v in report.numbers),
        "</table>",
        "<h2>Comparison</h2><p>Every method is fitted on half of the tokens and scored on the "
        "other half, over several random halves; mean ± standard error. Accuracies are "
        "certified intervals: the run bounds the probabilities it did not store.</p>",
        evaluate.format_table(report.table, fmt="html"),
        token_fragment(run, report, decoder),
        "<h2>Figures</h2>",
    ]
    parts.extend(figure_html(fig) for fig in report.figures)
    parts.append(f"<p style='color:#888'>forgetkit, {time.strftime('%Y-%m-%d %H:%M')}</p>")
    parts.append("</body></html>")
    return "".join(parts)
