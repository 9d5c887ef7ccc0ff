"""The token report (issue 37): a language model's run shown as text, with the sections a
token run has (no label issues, image data maps or per-class figures), the fate of every
target, the tokenizer named by the run, the CLI, bad input, and the page in Chromium."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.report import tokens as token_report

from .conftest import ROOT

LM_RUN = ROOT / "data_samples" / "lm_fortunes_gpt2_heldout_top8.npy"
TOKENIZER = ROOT / "data_samples" / "lm_fortunes_tokenizer.json"


def fates_ref(correct):
    """Each token's fate by the definitions, one token at a time."""
    out = []
    for col in np.asarray(correct).T:
        if col.all():
            out.append("always")
        elif col[-1]:
            out.append("learned")
        elif col.any():
            out.append("forgotten")
        else:
            out.append("never")
    return out


def spans_ref(seq, pos, ok, min_length):
    """Maximal runs of consecutive positions of one sequence, every target correct."""
    spans, start = [], None
    for i in range(len(seq) + 1):
        joined = (i < len(seq) and start is not None and seq[i] == seq[i - 1]
                  and pos[i] == pos[i - 1] + 1 and ok[i])
        if start is not None and not joined:
            if i - start >= min_length:
                spans.append([start, i - 1])
            start = None
        if i < len(seq) and start is None and ok[i]:
            start = i
    return spans


def test_fates_and_memorized_runs_equal_plain_loops():
    rng = np.random.default_rng(0)
    correct = rng.random((5, 400)) < 0.6
    correct[:, :10] = True
    correct[:, 10:20] = False
    got = [token_report.FATES[f] for f in token_report.token_fates(correct)]
    assert got == fates_ref(correct)
    assert set(got) == set(token_report.FATES)
    seq = np.repeat(np.arange(8), 50)
    pos = np.tile(np.arange(50), 8)
    pos[120:] += 1  # a gap inside sequence 2
    ok = rng.random(400) < 0.85
    for m in (1, 3, 6):
        assert token_report.memorized_runs(seq, pos, ok, min_length=m).tolist() == \
            spans_ref(seq, pos, ok, m)


@pytest.fixture(scope="module")
def lm_run():
    return fk.load(LM_RUN)


@pytest.fixture(scope="module")
def report_file(lm_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "lm.html"
    assert main(["report", str(LM_RUN), "-o", str(path), "--seeds", "0", "--quiet"]) == 0
    return path


def test_the_report_is_made_for_tokens(lm_run, report_file):
    text = report_file.read_text(encoding="utf-8")
    # sections by what a token run can answer
    assert "label issue" not in text.lower() and "confident learning" not in text.lower()
    assert "Data map" not in text and "per class" not in text.lower()
    assert not re.search(r"class \d", text)
    assert "certified interval" in text and "Memorization" in text
    # every sequence, every stored target once, with the fate of its correctness
    seq, pos = lm_run.sequence_ids, lm_run.positions
    found = re.findall(r"data-testid='sequence' data-sequence-id='(\d+)'", text)
    assert sorted(map(int, found)) == sorted(np.unique(seq).tolist())
    tok = re.findall(r"data-testid='token' data-sequence-id='(\d+)' data-position='(\d+)' "
                     r"data-fate='(\w+)' data-row='(\d+)' tabindex='0'>([^<]*)</span>", text)
    assert len(tok) == lm_run.n_samples
    fates = fates_ref(lm_run.correctness())
    decoded = Tokenizer.from_file(str(TOKENIZER))
    for s, p, fate, row, shown in tok[::37]:
        r = int(row)
        assert (int(s), int(p)) == (seq[r], pos[r])
        assert fate == fates[r]
        assert html.unescape(shown) == decoded.decode([int(lm_run.labels[r])])
    assert "decoded by lm_fortunes_tokenizer.json" in text
    assert len(text) < 5_000_000
    # the hover data: each shown row's p(target) per checkpoint, as bytes 0..255
    data = json.loads(re.search(r"id='tok-data'>(.*?)</script>", text).group(1))
    rows = np.frombuffer(base64.b64decode(data["rows"]), "<i4")
    p = np.frombuffer(base64.b64decode(data["p"]), np.uint8).reshape(len(rows), -1)
    want = np.rint(lm_run.label_probs()[rows] * 255).astype(np.uint8)
    assert np.array_equal(p, want) and len(rows) == lm_run.n_samples


def test_large_runs_show_the_galleries_and_the_asked_sequences(lm_run, monkeypatch):
    monkeypatch.setattr(token_report, "ALL_SEQUENCES_MAX_TOKENS", 1000)
    report = token_report.build_tokens(lm_run, sequences=[5, 7], seeds=(0,))
    gallery = {s for items in report.galleries.values() for s, _, _ in items}
    assert set(report.shown.tolist()) == gallery | {5, 7}
    assert report.n_sequences == len(np.unique(lm_run.sequence_ids))
    with pytest.raises(fk.ForgetkitError, match="no sequence"):
        token_report.build_tokens(lm_run, sequences=[10**6], seeds=(0,))


def test_tokenizers_and_bad_input(lm_run, tmp_path, capsys):
    assert token_report.load_decoder(None, lm_run).source == TOKENIZER.name  # the run's
    bare = lm_run.replace(meta={})
    assert token_report.load_decoder(None, bare).texts([12]) == ["⟨12⟩"]
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(TOKENIZER, folder / "tokenizer.json")
    assert token_report.load_decoder(folder, lm_run).texts([40]) == \
        token_report.load_decoder(TOKENIZER, lm_run).texts([40])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(fk.ForgetkitError, match="cannot read the tokenizer file"):
        token_report.load_decoder(bad, lm_run)
    with pytest.raises(fk.ForgetkitError, match="does not exist"):
        token_report.load_decoder(tmp_path / "missing.json", lm_run)
    with pytest.raises(fk.ForgetkitError, match="tokenizer must be"):
        token_report.load_decoder(5, lm_run)
    out = tmp_path / "r.html"
    for extra, message in (
            (["--tokenizer", str(tmp_path / "missing.json")], "does not exist"),
            (["--train-run", str(LM_RUN)], "not labels a person gave"),
            (["--tokenizer", str(out)], None)):
        code = main(["report", str(LM_RUN), "-o", str(out), "--quiet", *extra])
        err = capsys.readouterr().err
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        if message:
            assert message in err
    assert not out.exists()  # nothing written on a refusal
    image_run = fk.Run(np.zeros((2, 3, 4), np.float32), np.zeros(3, int))
    with pytest.raises(fk.ForgetkitError, match="tokenizer and sequences"):
        fk.write_report(image_run, tmp_path / "x.html", tokenizer=TOKENIZER)


def test_png_figures_of_a_token_run(lm_run, tmp_path):
    paths = fk.write_report(lm_run, tmp_path / "figs", fmt="png", seeds=(0,))
    assert sorted(p.name for p in paths) == ["compare.png", "forget_learn.png",
                                              "loss_accuracy.png", "memorization.png"]


# ------------------------------------------------------------------ in the browser
def test_hover_focus_and_fragment_in_chromium(browser, report_file, lm_run):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    sid = int(lm_run.sequence_ids[-1])
    page.goto(report_file.as_uri() + f"#seq-{sid}")
    target = page.locator(f"#seq-{sid}")
    assert target.get_attribute("data-testid") == "sequence"
    assert page.evaluate(f"document.querySelector('#seq-{sid}').matches(':target')")
    box = target.bounding_box()
    assert -1 < box["y"] < 900  # scrolled to the top of the viewport
    token = target.locator("[data-testid=token]").nth(3)
    token.hover()
    tip = page.locator("#tok-tip")
    tip.wait_for(state="visible")
    assert "p(target)" in tip.inner_text()
    row = int(token.get_attribute("data-row"))
    ids, _ = lm_run.outputs.top_predictions(-1, rows=[row], n=token_report.TOP_SHOWN)
    texts = token_report.load_decoder(TOKENIZER, lm_run).texts(ids[0])
    top = tip.locator("[data-testid=token-top]").inner_text()
    assert texts[0].replace("\n", "⏎") in top
    assert tip.locator("svg polyline").count() == 1
    page.mouse.move(0, 0)
    tip.wait_for(state="hidden")
    other = target.locator("[data-testid=token]").nth(5)
    other.focus()
    tip.wait_for(state="visible")
    assert f"at position {other.get_attribute('data-position')}" in tip.inner_text()
    assert errors == []
    page.close()
