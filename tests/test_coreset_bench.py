"""bench/gpu_coreset_retrain.py's selection specs and the rule that chooses the default
(no training here: the GPU run is the bench itself)."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

PATH = Path(__file__).parents[1] / "bench" / "gpu_coreset_retrain.py"
spec = importlib.util.spec_from_file_location("gpu_coreset_retrain", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_specs_parse_and_label():
    assert bench.parse_spec("random") == ("random", None, 0.0, False)
    assert bench.parse_spec("ccs:aum:auto:balanced") == ("ccs", "aum", "auto", True)
    assert bench.parse_spec("ccs:el2n:0.1") == ("ccs", "el2n", 0.1, False)
    assert bench.parse_spec("ccs:aum:gentle:balanced") == ("ccs", "aum", "gentle", True)
    assert bench.spec_label("ccs:aum:gentle") == "ccs aum cut=gentle"
    assert bench.spec_label("ccs:dynamic_uncertainty:auto:balanced") == \
        "ccs dynamic_uncertainty cut=auto balanced"
    assert bench.spec_label("hardest:el2n") == "hardest el2n"
    for bad in ("best:el2n", "ccs", "ccs:entropy", "random:el2n", "ccs:aum:auto:yes",
                "ccs:aum:soft"):
        with pytest.raises(ValueError, match="bad selection spec"):
            bench.parse_spec(bad)
    with pytest.raises(SystemExit):  # the confirmation seeds must be fresh
        bench.parse_args(["--out", "x", "--choose-seeds", "0", "1", "--seeds", "1", "2"])


def record_of(accuracies):
    """A result record with one choosing-phase job per (label, keep) and accuracy."""
    jobs = [dict(phase="choose", label=label, keep=keep, seed=0, accuracy=acc)
            for label, row in accuracies.items()
            for keep, acc in zip((0.7, 0.1), row, strict=True)]
    return dict(config=dict(keep=[0.7, 0.1]), jobs=jobs)


def test_the_default_is_chosen_by_the_fixed_rule():
    specs = ["ccs:aum:auto", "ccs:el2n:auto", "ccs:variability:auto"]
    # the best mean is below random at 10%: the best mean of those at least random wins
    record = record_of({"random": (0.90, 0.70), "ccs aum cut=auto": (0.95, 0.69),
                        "ccs el2n cut=auto": (0.91, 0.71), "ccs variability cut=auto":
                        (0.90, 0.72)})
    chosen, why = bench.choose_default(record, specs)
    assert chosen == "ccs:el2n:auto" and why.startswith("best mean among those at least")
    # none at least random everywhere: the best mean
    record = record_of({"random": (0.90, 0.70), "ccs aum cut=auto": (0.95, 0.69),
                        "ccs el2n cut=auto": (0.89, 0.71)})
    chosen, why = bench.choose_default(record, specs[:2])
    assert chosen == "ccs:aum:auto" and why.startswith("none at least random")


def test_job_list_selects_with_the_library():
    import forgetkit as fk

    rng = np.random.default_rng(0)
    scores = pd.DataFrame({s: rng.normal(size=200) for s in bench.SCORES})
    labels = np.repeat(np.arange(4), 50)
    args = bench.parse_args(["--out", "x", "--keep", "0.5", "0.1"])
    jobs = bench.job_list(args, ["random", "ccs:aum:auto:balanced", "full"], [3], scores,
                          200, labels)
    assert [(j["label"], j["keep"]) for j in jobs] == [
        ("random", 0.5), ("random", 0.1), ("ccs aum cut=auto balanced", 0.5),
        ("ccs aum cut=auto balanced", 0.1), ("full", 1.0)]
    np.testing.assert_array_equal(jobs[3]["idx"], fk.select_coreset(
        scores, 0.1, score="aum", hard_cutoff="auto", labels=labels, seed=3))
    assert np.bincount(labels[jobs[3]["idx"]]).tolist() == [5, 5, 5, 5]
    assert len(jobs[4]["idx"]) == 200


def test_repeated_selections_share_one_training():
    from forgetkit.analysis.scores import HARD_CUTOFF_SCHEDULES

    assert bench.HARD_CUTOFF_SCHEDULES == tuple(HARD_CUTOFF_SCHEDULES)
    rng = np.random.default_rng(1)
    scores = pd.DataFrame({s: rng.normal(size=400) for s in bench.SCORES})
    labels = np.repeat(np.arange(4), 100)
    args = bench.parse_args(["--out", "x", "--keep", "0.5", "0.3", "0.1"])
    specs = ["ccs:aum:auto:balanced", "ccs:aum:gentle:balanced", "ccs:aum:0:balanced"]
    jobs = bench.job_list(args, specs, [3, 4], scores, 400, labels)
    assert [j["cutoff_used"] for j in jobs if j["seed"] == 3] == [
        0, 0.1, 0.3, 0, 0, 0.3, 0, 0, 0]
    trained = {}
    to_train, repeats = bench.split_repeats(jobs, trained)
    # keep 0.5: one training for the three; keep 0.3: gentle = cutoff 0; keep 0.1:
    # gentle = auto; per seed
    assert sorted((j["label"], j["keep"], j["same_training_as"]) for j in repeats
                  if j["seed"] == 3) == [
        ("ccs aum balanced", 0.3, "ccs aum cut=gentle balanced"),
        ("ccs aum balanced", 0.5, "ccs aum cut=auto balanced"),
        ("ccs aum cut=gentle balanced", 0.1, "ccs aum cut=auto balanced"),
        ("ccs aum cut=gentle balanced", 0.5, "ccs aum cut=auto balanced")]
    assert len(to_train) == 10 and len(repeats) == 8 and len(trained) == 10
    for rep in repeats:
        twin = next(j for j in to_train if j["key"] == rep["key"])
        np.testing.assert_array_equal(rep["idx"], twin["idx"])
    # a later phase repeats nothing trained before; new seeds are new selections
    again, more = bench.split_repeats(bench.job_list(args, specs[:1], [3, 5], scores, 400,
                                                     labels), trained)
    assert [j["seed"] for j in again] == [5, 5, 5] and len(more) == 3


def test_equal_steps_is_the_default_protocol():
    args = bench.parse_args(["--out", "x"])
    assert (args.protocol, args.steps) == ("equal_steps", 60000 // 512 * 8) == (
        "equal_steps", 936)
    args = bench.parse_args(["--out", "x", "--epochs", "4", "--batch-size", "100",
                             "--train-subset", "1050"])
    assert args.steps == 10 * 4  # the full set's steps without the partial batch
    assert bench.parse_args(["--out", "x", "--steps", "50"]).steps == 50
    args = bench.parse_args(["--out", "x", "--fixed-epochs"])
    assert (args.protocol, args.steps, args.epochs) == ("fixed_epochs", None, 8)
    for bad in (["--fixed-epochs", "--steps", "10"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--out", "x", *bad])


def test_batch_stream_passes_over_the_subset_in_full_batches():
    stream = bench.batch_stream(6000, 512, 936, np.random.default_rng(0))
    assert stream.shape == (936, 512)  # every batch full, the same steps as the full set
    flat = stream.ravel()
    for p in range(936 * 512 // 6000):  # each whole pass is a permutation
        assert np.array_equal(np.sort(flat[p * 6000:(p + 1) * 6000]), np.arange(6000))
    counts = np.bincount(flat, minlength=6000)
    assert counts.min() == 79 and counts.max() == 80  # 79.87 passes
    # a subset smaller than a batch: batches still full, each sample in turn
    small = bench.batch_stream(3, 4, 3, np.random.default_rng(1))
    assert small.shape == (3, 4) and np.bincount(small.ravel()).tolist() == [4, 4, 4]
    assert np.array_equal(bench.batch_stream(50, 8, 7, np.random.default_rng(2)),
                          bench.batch_stream(50, 8, 7, np.random.default_rng(2)))


def test_training_takes_the_protocols_steps():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    data = (torch.tensor(rng.normal(size=(64, 1, 6, 6)), dtype=torch.float32),  # small:
            torch.tensor(rng.integers(0, 10, 64)),  # ResNet-18 pools to any size
            torch.tensor(rng.normal(size=(16, 1, 6, 6)), dtype=torch.float32),
            torch.tensor(rng.integers(0, 10, 16)))
    args = bench.parse_args(["--out", "x", "--width", "2", "--batch-size", "4",
                             "--train-subset", "32", "--epochs", "1"])
    assert args.steps == 8
    # equal steps: the small subset takes the full set's 8 steps (4 passes over 8)
    acc, _, diag = bench.train(args, data, np.arange(8), 0, epochs=args.epochs,
                               steps=args.steps)
    assert diag["steps"] == 8 and diag["passes"] == 4.0 and 0 <= acc <= 1
    assert len(diag["loss_trace"]) == 8 and np.isfinite(diag["loss_final"])
    assert 0 <= diag["accuracy_fp32"] <= 1 and 0 <= diag["accuracy_bn_reestimated"] <= 1
    # fixed epochs (the earlier protocol): 2 steps for 8 samples; 3 epochs of 2 steps
    _, _, diag = bench.train(args, data, np.arange(8), 0, epochs=1, steps=None)
    assert diag["steps"] == 2 and diag["passes"] == 1.0
    seen = []
    _, _, diag = bench.train(args, data, np.arange(10), 0, epochs=3,
                             recorder=lambda model, epoch: seen.append(epoch))
    assert diag["steps"] == 6 and seen == [0, 1, 2]  # no last partial batch


def confirm_record(rows, seeds, **config):
    """A result record with confirming jobs: {label: {keep: [accuracy per seed]}}."""
    jobs = [dict(phase="confirm", label=row, keep=keep, seed=seed, accuracy=acc)
            for row, by_keep in rows.items() for keep, accs in by_keep.items()
            for seed, acc in zip(seeds, accs, strict=True)]
    return dict(config=dict(dict(keep=[0.7, 0.1], steps=936, lr=0.1), **config), jobs=jobs,
                default="ccs:aleatoric:0:balanced", default_label="ccs aleatoric balanced")


def test_runs_pool_their_confirming_seeds_and_compare_seed_by_seed():
    first = confirm_record({"random": {0.7: [0.93, 0.92], 0.1: [0.90, 0.91]},
                            "ccs aleatoric balanced": {0.7: [0.94, 0.93], 0.1: [0.89, 0.92]}},
                           [80, 81])
    first["jobs"].append(dict(phase="choose", label="random", keep=0.7, seed=70,
                              accuracy=0.5))
    second = confirm_record({"random": {0.7: [0.91], 0.1: [0.90]},
                             "ccs aleatoric balanced": {0.7: [0.95], 0.1: [0.93]}}, [90])
    pooled = bench.pool([first, second])
    t = bench.table(pooled)
    assert t["random"]["0.7"][2] == 3 and t["random"]["0.7"][0] == pytest.approx(92.0)
    assert bench.table(pooled, phase="choose")["random"]["0.7"][0] == pytest.approx(50.0)
    paired = bench.against_random(pooled, "ccs aleatoric balanced")
    assert paired["0.7"] == pytest.approx((2.0, 1.0, 3, 3))  # +1, +1, +4 points
    assert paired["0.1"][2:] == (2, 3) and paired["0.1"][1] == pytest.approx(1.0)
    text = bench.markdown(pooled)
    assert "keep 10% +1.00 (median +1.00, above on 2 of 3)" in text
    # another protocol, or a seed trained twice: refused
    with pytest.raises(SystemExit, match="steps differ"):
        bench.pool([first, confirm_record({"random": {0.7: [0.9], 0.1: [0.9]}}, [90],
                                          steps=100)])
    with pytest.raises(SystemExit, match="seed 81 was trained in two runs"):
        bench.pool([first, confirm_record({"random": {0.7: [0.9], 0.1: [0.9]}}, [81])])
