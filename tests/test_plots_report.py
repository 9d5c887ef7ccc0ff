import shutil
import subprocess

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import forgetkit as fk  # noqa: E402
from forgetkit import plots  # noqa: E402
from forgetkit.cli import main  # noqa: E402
from forgetkit.evaluate import ensemble_size_curve, window_curve  # noqa: E402
from forgetkit.report import build, to_html  # noqa: E402

from .conftest import ROOT, SAMPLE_RUN, require_real_part  # noqa: E402

NOISY_TEST = ROOT / "data_samples" / "fmnist_resnet18_sym20_h200_test.npz"
NOISY_TRAIN = ROOT / "data_samples" / "fmnist_resnet18_sym20_h200_train5k.npz"


def saved_png(ax, tmp_path, name):
    path = tmp_path / f"{name}.png"
    ax.figure.savefig(path)
    plt.close(ax.figure)
    img = mpimg.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.01  # not blank
    return img


@pytest.fixture(scope="module")
def table(real_run):
    return fk.compare(real_run, seeds=(0, 1))


def test_every_figure_from_the_real_run(real_run, table, tmp_path):
    cases = {
        "accuracy": (plots.accuracy_retention(real_run), "epoch", "share of test samples (%)"),
        "forget_learn": (plots.forget_learn([real_run, real_run.isel(epochs=range(0, 60, 2))],
                                            labels=["every epoch", "every 2nd"]),
                         "epoch", "share of test samples (%)"),
        "epochs_correct": (plots.epochs_correct_hist(real_run), "number of epochs correct",
                           "samples wrong at the end"),
        "last_correct": (plots.last_correct_hist(real_run), "last epoch correct",
                         "forgotten samples"),
        "per_class": (plots.per_class_forgetting(real_run),
                      "samples forgotten by the end (% of the class)", ""),
        "compare": (plots.compare_methods(table),
                    "test accuracy (%), mean ± standard error over splits", ""),
        "size": (plots.gain_vs_checkpoints(ensemble_size_curve(real_run, seeds=(0,))),
                 "checkpoints used (k)", "test gain over single network (pp)"),
        "window": (plots.gain_vs_window(window_curve(real_run, windows=(0, 1), seeds=(0,))),
                   "window w (epochs averaged: 2w + 1)", "test gain over single network (pp)"),
    }
    for name, (ax, xlabel, ylabel) in cases.items():
        assert ax.get_xlabel() == xlabel, name
        if ylabel:
            assert ax.get_ylabel() == ylabel, name
        saved_png(ax, tmp_path, name)
    legend = plots.forget_learn([real_run, real_run], labels=["a", "b"]).get_legend()
    assert [t.get_text() for t in legend.get_texts()][:2] == ["a: F_e (forget)", "a: L_e (learn)"]


def test_noise_figure_from_the_gpu_run(tmp_path):
    train = fk.load(NOISY_TRAIN)
    mask = np.zeros(train.n_samples, bool)
    mask[train.meta["noise_mask"]] = True
    ax = plots.noisy_dominance(train, mask, epochs=train.epochs)
    assert ax.get_ylabel() == "clean − noisy among large-loss points"
    assert len(ax.lines[-1].get_ydata()) == train.n_epochs
    saved_png(ax, tmp_path, "noise")


def test_plots_draw_on_a_given_axes(real_run):
    fig, ax = plt.subplots()
    assert plots.accuracy_retention(real_run, ax=ax) is ax
    plt.close(fig)


def test_report_html_is_self_contained(real_run, tmp_path):
    summary, table, kf, figures = build(real_run, seeds=(0, 1))
    text = to_html(real_run, summary, table, kf, figures, source="sample")
    assert text.count("<img") == len(figures) == 8
    assert "http" not in text.replace("http-equiv", "")  # no external resources
    for heading in ("Summary", "Comparison", "The fused plan", "Figures"):
        assert f">{heading}<" in text
    assert "95.29%" in text and "KF(inf)" in text
    for fig in figures:
        assert fig.png.startswith(b"\x89PNG") and len(fig.caption) > 40


def test_cli_report_html_and_png(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(NOISY_TEST), "--train-run", str(NOISY_TRAIN), "--seeds", "0",
                 "-o", str(out), "--quiet"]) == 0
    text = out.read_text()
    assert text.count("<img") == 10 and "Clean against noisy" in text
    assert "Data map of the training run" in text and ">Label issues in the training run<" in text
    assert main(["report", str(SAMPLE_RUN), "--seeds", "0", "--format", "png", "-o",
                 str(tmp_path / "figs")]) == 0
    assert len(list((tmp_path / "figs").glob("*.png"))) == 8
    # a training run without a known noise mask: data map and label issues, no noise figure
    assert main(["report", str(SAMPLE_RUN), "--train-run", str(SAMPLE_RUN), "--seeds", "0",
                 "-o", str(tmp_path / "x.html"), "--quiet"]) == 0
    text = (tmp_path / "x.html").read_text()
    assert "Clean against noisy" not in text and ">Label issues in the training run<" in text
    assert text.count("<img") == 9


def test_class_names_are_text_not_math(tmp_path, capsys):
    names = ["$\\frac{a$", "b$c", "50%"]
    run = fk.Run(np.random.default_rng(0).normal(size=(4, 60, 3)).astype(np.float32),
                 np.arange(60) % 3, class_names=names)
    fk.save(run, tmp_path / "math.npy")
    assert main(["report", str(tmp_path / "math.npy"), "--seeds", "0", "-o",
                 str(tmp_path / "r.html"), "--quiet"]) == 0, capsys.readouterr().err
    ax = fk.plots.per_class_forgetting(run)
    ax.figure.canvas.draw()
    assert sorted(t.get_text() for t in ax.get_yticklabels()) == sorted(names)


def test_report_renders_in_headless_chromium(tmp_path):
    require_real_part("Debian chromium (headless browser)", shutil.which("chromium") is not None)
    out = tmp_path / "r.html"
    assert main(["report", str(SAMPLE_RUN), "--seeds", "0", "-o", str(out), "--quiet"]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1100,2400",
         f"--screenshot={shot}", out.as_uri()],
        capture_output=True, timeout=120, check=True)
    img = mpimg.imread(shot)
    assert img.shape[:2] == (2400, 1100)
    # the page is not blank: dark text and coloured plot lines on white
    assert (img[..., :3] < 0.3).mean() > 0.005
    assert img[..., :3].std(axis=2).max() > 0.2
