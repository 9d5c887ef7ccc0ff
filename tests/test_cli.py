import json
import subprocess
import sys

import numpy as np
import pytest

import forgetkit as fk
from forgetkit.cli import main

from .conftest import SAMPLE_RUN, make_run


def test_analyze_sample_run(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert main(["analyze", str(SAMPLE_RUN), "--json", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "final accuracy:        95.29%" in text
    assert "max forget fraction" in text and "double descent" in text
    rec = json.loads(out.read_text())
    assert len(rec["forget_fraction"]) == 60 and rec["final_accuracy"] == pytest.approx(0.9529)


def test_convert_then_analyze(tmp_path, capsys):
    dst = tmp_path / "r.parquet"
    assert main(["convert", str(SAMPLE_RUN), str(dst), "--quiet"]) == 0
    assert main(["analyze", str(dst), "--quiet"]) == 0
    assert "95.29%" in capsys.readouterr().out


def test_bare_npy_with_labels_file(tmp_path, capsys):
    run = make_run()
    np.save(tmp_path / "o.npy", np.asarray(run.outputs))
    np.savetxt(tmp_path / "y.txt", run.labels, fmt="%d")
    assert main(["analyze", str(tmp_path / "o.npy"), "--labels", str(tmp_path / "y.txt")]) == 0


@pytest.mark.parametrize(
    "make,msg",
    [
        (lambda d: fk.save(make_run(), d / "r.npz") and ["analyze", str(d / "nope.npz")],
         "no such run"),
        (lambda d: (np.save(d / "o.npy", np.zeros((4, 3))), ["analyze", str(d / "o.npy"),
                                                            "--labels", str(d / "o.npy")])[1],
         r"outputs must have shape \(epochs, samples, classes\); got shape \(4, 3\)"),
        (lambda d: ((d / "x.npz").write_bytes(b"PK\x03\x04garbage"),
                    ["analyze", str(d / "x.npz")])[1], "truncated or corrupt"),
        (lambda d: ["convert", str(SAMPLE_RUN), str(d / "x.csv")], "cannot tell the format"),
    ],
)
def test_errors_are_one_line_without_traceback(tmp_path, make, msg):
    args = make(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "forgetkit.cli", *args],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert __import__("re").search(msg, lines[0]), lines[0]


def test_convert_refuses_to_overwrite_its_input(tmp_path):
    src = tmp_path / "r.npy"
    fk.save(make_run(), src)
    before = src.read_bytes()
    assert main(["convert", str(src), str(src), "--quiet"]) == 1
    assert src.read_bytes() == before
