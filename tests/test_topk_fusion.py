"""Certified fusion on top-k token runs: layout, bounds and certificates against plain-numpy
references, soundness against the full logits, k == vocabulary equal to the full run bit for
bit, and larger k never widening the interval."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import forgetkit as fk
from forgetkit import kernels
from forgetkit.errors import ForgetkitError
from forgetkit.fusion import topk as ft
from forgetkit.kinds import kind_of
from forgetkit.kinds.topk import TopKOutputs, record_fields, token_ids, topk_records
from tests.reference_topk import (
    bounds_ref,
    certify_ref,
    layout_ref,
    libm_exp,
    unstored_bound_ref,
)

SAMPLE_LM = Path(__file__).resolve().parents[1] / "data_samples" / \
    "lm_fortunes_gpt2_heldout_top8.npy"


def make_logits(seed=0, n_epochs=8, n_tokens=300, vocab=20, ties=False):
    """float32 logits (E, N, V) of a run that learns and forgets, and targets (N,)."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, vocab, n_tokens)
    z = rng.normal(size=(n_epochs, n_tokens, vocab)) * 1.5
    learn = np.linspace(-1, 2.5, n_epochs)[:, None] + rng.normal(size=(n_epochs, n_tokens))
    z[:, np.arange(n_tokens), targets] += learn
    if ties:
        z = np.round(z * 2) / 2
    return z.astype(np.float32), targets


def records_of(logits, targets, k):
    return np.stack([topk_records(z, targets, k) for z in logits])


def data_of(logits, targets, k):
    return ft.TopKData(records_of(logits, targets, k), targets, logits.shape[2])


# ------------------------------------------------------------ kernels vs references
def test_layout_and_bounds_match_the_reference():
    logits, targets = make_logits(1, n_epochs=4, n_tokens=60, vocab=12, ties=True)
    rec = records_of(logits, targets, 3)
    data = ft.TopKData(rec, targets, 12)
    layout = ft.Layout(data, range(4), slice(None))
    cls, label_col, unstored_col = layout.parts
    rows = layout_ref(rec, targets, 12)
    for n, row in enumerate(rows):
        width = len(row)
        assert layout.ends[n] == width
        assert cls[n, :width].tolist() == [c for c, _ in row]
        assert (cls[n, width:] == 13).all()  # padding
        assert cls[n, label_col[n]] == targets[n]
        kinds = [kind for _, kind in row]
        assert unstored_col[n] == (kinds.index("unstored") if "unstored" in kinds else -1)
    upper, lower = np.empty(cls.shape), np.empty(cls.shape)
    for e in range(4):
        assert unstored_bounds(rec[e], targets).tolist() == [
            unstored_bound_ref(r, y) for r, y in zip(rec[e], targets, strict=True)]
        kernels.topk_bounds(record_fields(rec[e]), targets, 12, (cls, label_col, unstored_col),
                            upper, lower)
        for n, row in enumerate(rows):
            up, low = bounds_ref(rec[e, n], targets[n], row)
            assert upper[n, :len(row)].tolist() == up
            assert lower[n, :len(row)].tolist() == low
            assert (upper[n, len(row):] == 0).all() and (lower[n, len(row):] == 0).all()


@pytest.mark.parametrize("build", ["serial", "parallel"])
def test_label_probs_are_the_c_librarys_exp_of_target_less_lse(build):
    """The likelihood fit's target probabilities (N, E), read from strided record fields:
    exp(target - lse) in float64 with the C library's exp, bit for bit, on any threads."""
    logits, targets = make_logits(2, n_epochs=5, n_tokens=700, vocab=15)
    rec = records_of(logits, targets, 4)
    want = libm_exp(rec["target"].astype(np.float64) - rec["lse"].astype(np.float64)).T
    with kernels.forced(build):
        got = ft.label_probs(ft.TopKData(rec, targets, 15))
    assert got.shape == (700, 5) and got.flags.c_contiguous
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def test_certificate_matches_the_reference_on_ties():
    rng = np.random.default_rng(3)
    logits, targets = make_logits(2, n_epochs=3, n_tokens=200, vocab=9, ties=True)
    data = data_of(logits, targets, 2)
    layout = ft.Layout(data, range(3), slice(None))
    rows = layout_ref(records_of(logits, targets, 2), targets, 9)
    # bounds rounded to a coarse grid: ties between lower and upper bounds everywhere
    upper = np.round(rng.uniform(0, 1, layout.shape) * 4) / 4
    lower = np.minimum(upper, np.round(rng.uniform(0, 1, layout.shape) * 4) / 4)
    n_idx = np.arange(len(targets))
    lower[n_idx, layout.label_col] = upper[n_idx, layout.label_col]
    pred, certified, state = kernels.topk_certify(upper, lower, layout.parts, 9)
    for n, row in enumerate(rows):
        w = len(row)
        assert (pred[n], certified[n], state[n]) == certify_ref(
            upper[n, :w].tolist(), lower[n, :w].tolist(), row, targets[n])


# ------------------------------------------------------------------ soundness
def completion(logits, records, targets, mode):
    """Probabilities (E, N, V) that the records allow: exp(z - lse) for the stored classes and
    the target, and for the others a value in [0, u_e] (``mode`` "records": exp(z - lse),
    checked to be within; "max":
    u_e where no stored logit ties the k-th one below it; "zero": 0)."""
    n_epochs, n_tokens, vocab = logits.shape
    out = np.empty((n_epochs, n_tokens, vocab))
    for e in range(n_epochs):
        rec = records[e]
        lse = rec["lse"].astype(np.float64)[:, None]
        u = unstored_bounds(rec, targets)
        p = libm_exp(logits[e].astype(np.float64) - lse)
        free = np.ones((n_tokens, vocab), dtype=bool)
        np.put_along_axis(free, token_ids(rec).astype(np.int64), False, axis=1)
        free[np.arange(n_tokens), targets] = False
        if mode == "records":  # the bound holds for the records' own probabilities
            assert (np.where(free, p, 0.0) <= u[:, None]).all()
            fill = p
        elif mode == "max":  # ids below the k-th stored one cannot reach p_k
            below = np.arange(vocab)[None, :] < token_ids(rec)[:, -1:].astype(np.int64)
            p_k = libm_exp(rec["logits"][:, -1].astype(np.float64) - lse[:, 0])
            fill = np.where(below & (u == p_k)[:, None], 0.0, u[:, None])
        else:
            fill = np.zeros_like(p)
        p_stored = libm_exp(rec["logits"].astype(np.float64) - lse)
        np.put_along_axis(p, token_ids(rec).astype(np.int64), p_stored, axis=1)
        p[np.arange(n_tokens), targets] = libm_exp(rec["target"].astype(np.float64) - lse[:, 0])
        out[e] = np.where(free, fill, p)
    return out


def unstored_bounds(rec, targets):
    """`unstored_bound_ref` of records (N,), vectorised (the same arithmetic)."""
    lse = rec["lse"].astype(np.float64)
    p = libm_exp(rec["logits"].astype(np.float64) - lse[:, None])
    total = np.zeros(len(rec))
    for j in range(p.shape[1]):
        total += p[:, j]
    stored = (token_ids(rec) == targets[:, None]).any(axis=1)
    total += np.where(stored, 0.0, libm_exp(rec["target"].astype(np.float64) - lse))
    slack = 2.0 ** -21 * np.maximum(np.maximum(np.abs(lse),
                                               np.abs(rec["logits"][:, 0].astype(np.float64))),
                                    1.0)
    return np.minimum(p[:, -1], np.maximum(0.0, 1.0 - total) + slack)


def mixture(probs, recipe):
    """The fused probabilities (N, V) of a recipe on probabilities (E, N, V), with the
    arithmetic of the fusers."""
    out = None
    for kind, pos, value in recipe:
        if kind == kernels.MEAN:
            out = sum(probs[e] for e in pos) / len(pos)
        elif kind == kernels.WEIGHTED:
            out = sum(w * probs[e] for e, w in zip(pos, value, strict=True))
        else:
            out = value * (sum(probs[e] for e in pos) / len(pos)) + (1 - value) * out
    return out


def check_sound(logits, targets, k, recipe):
    """The certificates of ``recipe`` hold for several completions of the records."""
    records = records_of(logits, targets, k)
    pred, certified, state, label_prob = ft.certify(
        ft.TopKData(records, targets, logits.shape[2]), recipe, chunk=128)
    for mode in ("records", "max", "zero"):
        q = mixture(completion(logits, records, targets, mode), recipe)
        truth = np.argmax(q, axis=1)
        assert (truth[certified] == pred[certified]).all(), mode
        assert (truth[state == 1] == targets[state == 1]).all(), mode
        assert (truth[state == 0] != targets[state == 0]).all(), mode
        assert np.array_equal(label_prob, q[np.arange(len(targets)), targets])
    return pred, certified, state, label_prob


@pytest.mark.parametrize("k", [1, 2, 4])
def test_certificates_hold_for_every_completion(k):
    logits, targets = make_logits(4, n_epochs=6, n_tokens=200, vocab=16)
    recipes = [[(kernels.MEAN, [5], None)], [(kernels.MEAN, [2, 3, 4, 5], None)],
               [(kernels.WEIGHTED, [0, 3, 5], np.array([0.2, 0.3, 0.5]))],
               [(kernels.MEAN, [5], None), (kernels.MIX, [1, 2, 3], 0.4),
                (kernels.MIX, [0, 1], 0.25)]]
    for recipe in recipes:
        _, _, state, label_prob = check_sound(logits, targets, k, recipe)
        # the target's probability is the model's up to the float32 rounding of lse
        softmax = np.stack([fk.probs.softmax(z) for z in logits])
        q = mixture(softmax, recipe)
        np.testing.assert_allclose(label_prob, q[np.arange(len(targets)), targets], rtol=1e-6)
        if len(recipe) == 1 and recipe[0][1] == [5]:  # one checkpoint: exactly its argmax
            assert ((state == 1) == (np.argmax(logits[5], axis=1) == targets)).all()
            assert (state != -1).all()


# ------------------------------------------------------- the certificate's quick answers
def certify_by_rows(data, recipe):
    """`ft.certify` without its quick answers: every token's layout, the recipe's bounds
    over it (`ft.recipe_bounds`) and `kernels.topk_certify` of them."""
    layout = ft.Layout(data, ft.recipe_epochs(recipe), slice(None))
    upper, lower = ft.recipe_bounds(data, recipe, layout)
    pred, certified, state = kernels.topk_certify(upper, lower, layout.parts, data.vocab_size)
    return pred, certified, state, upper[np.arange(len(pred)), layout.label_col]


QUICK_RECIPES = [
    lambda E: [(kernels.MEAN, [E - 1], None)],
    lambda E: [(kernels.MEAN, list(range(E)), None)],
    lambda E: [(kernels.WEIGHTED, list(range(E)), _weights(E))],
    lambda E: [(kernels.WEIGHTED, list(range(E)), np.r_[np.zeros(E - 1), 1.0])],
    lambda E: [(kernels.WEIGHTED, list(range(E)), np.r_[1e-300 * np.ones(E - 1), 1.0])],
    lambda E: [(kernels.MEAN, [E - 1], None), (kernels.MIX, [0], 0.5),
               (kernels.MIX, list(range(E)), 0.25)],
    lambda E: [(kernels.MEAN, [E - 1], None), (kernels.MIX, [0], 1.0),
               (kernels.MIX, [E - 1], 0.0)],
    lambda E: [(kernels.MEAN, [0], None), (kernels.MIX, [E - 1], 1e-300)],
]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n_epochs=st.integers(1, 5), vocab=st.integers(2, 12),
       recipe=st.sampled_from(QUICK_RECIPES), spread=st.sampled_from([1, 3, 40, 800]),
       k_at=st.floats(0, 1))
def test_quick_certificates_equal_the_full_ones(seed, n_epochs, vocab, recipe, spread, k_at):
    """Tokens answered from the target's and two other bounds (most of them) get the bits of
    the full layout and bounds: every output, and with ``states_only`` the state and the
    target's probability (the prediction, where made, too). Integer logits tie often; a
    spread of 800 makes probabilities that underflow."""
    rng = np.random.default_rng(seed)
    logits = rng.integers(-spread, spread + 1, (n_epochs, 40, vocab)).astype(np.float32)
    targets = rng.integers(0, vocab, 40)
    logits[:, :10, :] = 0.0  # every class tied
    logits[:, 10:20][np.arange(n_epochs)[:, None], np.arange(10), targets[10:20]] += 2 * spread
    k = 1 + int(k_at * (vocab - 2)) if vocab > 2 else 1
    data, steps = data_of(logits, targets, k), recipe(n_epochs)
    want = certify_by_rows(data, steps)
    got = ft.certify(data, steps)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)
    pred, certified, state, label_prob = ft.certify(data, steps, states_only=True)
    assert np.array_equal(state, want[2]) and np.array_equal(label_prob, want[3])
    made = pred != -1
    assert np.array_equal(pred[made], want[0][made])
    assert np.array_equal(certified[made], want[1][made])
    assert (state[~made] == 0).all()


def test_quick_answers_decide_most_tokens_of_the_sample():
    """On the GPT-2 sample, Knowledge Fusion's certificate answers most tokens quickly (pred
    -1 marks the certified-wrong ones answered from a rival alone), the same as in full."""
    run = fk.load(SAMPLE_LM)
    kf = fk.KnowledgeFusion().fit(run)
    data, recipe = kind_of(run).certified_bounds(run), kf.recipe(run)
    state = ft.certify(data, recipe)[2]
    pred, _, quick_state, _ = ft.certify(data, recipe, states_only=True)
    assert np.array_equal(quick_state, state)
    assert (pred == -1).mean() > 0.5
    assert kf.certified_accuracy(run) == (np.mean(state == 1), np.mean(state != 0))


# -------------------------------------------------------- larger k, tighter interval
def _weights(n):
    w = np.linspace(1, 2, n)
    return w / w.sum()


RECIPES = [lambda E: [(kernels.MEAN, [E - 1], None)],
           lambda E: [(kernels.MEAN, list(range(E)), None)],
           lambda E: [(kernels.WEIGHTED, list(range(E)), _weights(E))],
           lambda E: [(kernels.MEAN, [E - 1], None), (kernels.MIX, [0], 0.5),
                      (kernels.MIX, list(range(E)), 0.25)]]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n_epochs=st.integers(1, 4), vocab=st.integers(2, 9),
       recipe=st.sampled_from(RECIPES), spread=st.sampled_from([1, 3, 20]))
def test_larger_k_never_widens_the_interval(seed, n_epochs, vocab, recipe, spread):
    rng = np.random.default_rng(seed)
    n_tokens = 25
    # small integers: exact ties between logits (and between bounds) are common
    logits = rng.integers(-spread, spread + 1, (n_epochs, n_tokens, vocab)).astype(np.float32)
    targets = rng.integers(0, vocab, n_tokens)
    steps = recipe(n_epochs)
    before, widths = None, []
    for k in range(1, vocab + 1):
        if k < vocab:
            state = check_sound(logits, targets, k, steps)[2]
            if before is not None:  # certified tokens stay certified, with the same answer
                kept = before != -1
                assert (state[kept] == before[kept]).all()
            before = state
        else:  # the softmax of the logits: the same answers up to the rounding of lse
            state = ft.certify(data_of(logits, targets, k), steps)[2]
            assert (state != -1).all()  # every token certified
        widths.append(int((state == -1).sum()))
    assert widths == sorted(widths, reverse=True)


# ------------------------------------------------------------------ fusers on runs
def topk_run(logits, targets, k):
    n = len(targets)
    outputs = TopKOutputs(records_of(logits, targets, k), logits.shape[2], np.arange(n) // 10,
                          np.arange(n) % 10)
    return fk.Run(outputs, targets, kind="topk")


def fusers():
    return [fk.KnowledgeFusion(), fk.KnowledgeFusion(grid=None, rule="paper"),
            fk.KnowledgeFusion(window=0, grid=11, stop_when_no_gain=True),
            fk.EnsembleSelection(max_checkpoints=4), fk.LikelihoodFusion(max_checkpoints=3),
            fk.EarlyStopping(), fk.CheckpointAverage("horizontal", max_checkpoints=3)]


def test_k_equal_to_the_vocabulary_gives_the_full_runs_results_bit_for_bit():
    logits, targets = make_logits(5, n_epochs=8, n_tokens=300, vocab=20)
    full, top = fk.Run(logits, targets), topk_run(logits, targets, 20)
    val, test = np.arange(150), np.arange(150, 300)
    for fuser in fusers():
        a = fuser.fit(full.isel(samples=val))
        b = type(fuser)(**fuser.get_params()).fit(top.isel(samples=val))
        assert a.checkpoints_ == b.checkpoints_
        if isinstance(a, fk.KnowledgeFusion):
            assert a.plan_ == b.plan_ and a.val_accuracy_ == b.val_accuracy_
            assert a.initial_accuracy_ == b.initial_accuracy_
            assert any(eps > 0 for _, eps in a.plan_)
        if a.weights_ is not None:
            assert np.array_equal(a.weights_, b.weights_)
        t_full, t_top = full.isel(samples=test), top.isel(samples=test)
        assert np.array_equal(a.predict_proba(t_full), b.predict_proba(t_top))
        assert np.array_equal(a.predict(t_full), b.predict(t_top))
        if isinstance(b, fk.KnowledgeFusion):
            for p, q in zip(a.staged_predict_proba(t_full), b.staged_predict_proba(t_top),
                            strict=True):
                assert np.array_equal(p, q)
        table = b.certified(t_top)
        assert table["certified"].all() and table["correct"].notna().all()
        low, high = b.certified_accuracy(t_top)
        assert low == high == np.mean(a.predict(t_full) == t_full.labels)
    table = fk.compare(top, seeds=(0, 1))
    expected = fk.compare(full, seeds=(0, 1))
    for column in ("k", "accuracy", "gain", "nll", "p_max"):
        assert np.array_equal(table[column], expected[column]), column
    assert np.array_equal(table["accuracy_low"], table["accuracy_high"])


def test_fit_on_a_topk_run_counts_certified_tokens():
    logits, targets = make_logits(6, n_epochs=8, n_tokens=400, vocab=30)
    run = topk_run(logits, targets, 3)
    kf = fk.KnowledgeFusion().fit(run)
    low, high = kf.certified_accuracy(run)
    # the eps search's counts are the certificates' counts (no exact ties in these logits)
    assert kf.val_accuracy_[-1] == low < high
    assert kf.initial_accuracy_ == np.mean(np.argmax(logits[-1], axis=1) == targets)
    table = kf.certified(run)
    assert list(table.columns) == ["target", "prediction", "certified", "correct", "label_prob"]
    assert table["correct"].isna().sum() == round((high - low) * len(targets))
    assert set(table["correct"].dropna().unique()) <= {True, False}
    assert np.array_equal(kf.predict(run), table["prediction"].to_numpy())
    # the target's fused probability is exact: the full run's up to the rounding of lse
    np.testing.assert_allclose(table["label_prob"],
                               kf.predict_proba(fk.Run(logits, targets))[np.arange(400), targets],
                               rtol=1e-6)
    # a plan fitted on the full run applies to the top-k run, inside its interval
    full = fk.KnowledgeFusion().fit(fk.Run(logits, targets))
    truth = np.mean(full.predict(fk.Run(logits, targets)) == targets)
    low, high = full.certified_accuracy(run)
    assert low <= truth <= high
    # on a full run every prediction is certified
    exact = full.certified(fk.Run(logits, targets))
    assert exact.index.name == "sample" and exact["certified"].all()
    assert (exact["correct"] == (exact["prediction"] == targets)).all()
    assert full.certified_accuracy(fk.Run(logits, targets)) == (truth, truth)
    with pytest.raises(ForgetkitError, match="predict_proba needs every class"):
        kf.predict_proba(run)
    with pytest.raises(ForgetkitError, match="use certified"):
        next(kf.staged_predict_proba(run))
    # the fitted plan's JSON says it was fitted on a top-k run, and reads back
    again = fk.load_fuser(kf.to_json())
    assert again.kind_ == "topk" and again.plan_ == kf.plan_
    assert again.certified_accuracy(run) == kf.certified_accuracy(run)


def test_compare_on_a_topk_run_reports_the_interval():
    logits, targets = make_logits(7, n_epochs=6, n_tokens=300, vocab=25)
    table = fk.compare(topk_run(logits, targets, 4), seeds=(0,))
    assert (table["accuracy"] == table["accuracy_low"]).all()
    assert (table["accuracy_low"] <= table["accuracy_high"]).all()
    assert table.loc["single", "accuracy_low"] == table.loc["single", "accuracy_high"]
    assert table["nll"].notna().all() and table["ece"].isna().all()
    text = fk.format_table(table)
    assert "certified interval (%)" in text and "[" in text
    curve = fk.evaluate.ensemble_size_curve(topk_run(logits, targets, 4), seeds=(0,))
    assert curve["windows"].iloc[0] == 0


def test_cli_fuse_compare_and_apply_on_a_topk_run(tmp_path, capsys):
    from forgetkit.cli import main

    logits, targets = make_logits(8, n_epochs=6, n_tokens=200, vocab=20)
    path = tmp_path / "tokens.npy"
    fk.save(topk_run(logits, targets, 3), path)
    plan = tmp_path / "plan.json"
    assert main(["fuse", str(path), "--plan", str(plan), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(fused, certified)" in out and "certified interval" in out
    assert main(["compare", str(path), "--seeds", "0", "--quiet"]) == 0
    assert "certified interval (%)" in capsys.readouterr().out
    assert main(["apply", str(plan), str(path), "--out", str(tmp_path / "p.npy"),
                 "--quiet"]) != 0
    err = capsys.readouterr().err.strip()
    assert "predict_proba needs every class" in err and len(err.splitlines()) == 1


def test_fusion_reads_24_bit_and_uint32_ids_alike():
    """A vocabulary above 65,536 ids: the records' 24-bit ids (and the uint32 ids of runs
    written before them) give the same plan, certificates and predictions."""
    from forgetkit.kinds.topk import convert_records, set_token_ids, token_ids, topk_dtype

    logits, targets = make_logits(9, n_epochs=5, n_tokens=200, vocab=12)
    small = records_of(logits, targets, 3)
    vocab, shift = 70_000, 65_530  # the same tokens moved above 2**16
    wide = convert_records(small, topk_dtype(3, vocab))
    set_token_ids(wide, token_ids(small).astype(np.int64) + shift)
    assert token_ids(wide).max() >= 1 << 16
    runs = [fk.Run(TopKOutputs(recs, vocab, np.arange(200), np.zeros(200, np.int32)),
                   targets + shift, kind="topk")
            for recs in (wide, convert_records(wide, topk_dtype(3, vocab, ids="uint32")))]
    assert runs[1].outputs.records.dtype.itemsize == 8 + 8 * 3
    fits = [fk.KnowledgeFusion().fit(run) for run in runs]
    assert fits[0].plan_ == fits[1].plan_
    tables = [kf.certified(run) for kf, run in zip(fits, runs, strict=True)]
    assert tables[0].equals(tables[1])
    assert tables[0]["prediction"].min() >= shift
    assert np.array_equal(fits[0].predict(runs[0]), fits[1].predict(runs[1]))
