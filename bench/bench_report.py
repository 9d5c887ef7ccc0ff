"""The HTML report with its sample explorer at the size of issue 26: 10,000 test and 50,000
training samples with their Fashion-MNIST images. Measures the file's size and, in Chromium
(Debian's, driven by Playwright), the time from the start of navigation to the first sample
card painted (the page loaded with ``#test-45``; the page's own clock), and from Playwright's
``goto`` until it sees the card (an upper bound: its polling waits for the busy page), against
the same report without the explorer (its load event) loaded in the same browser.

    python -m bench.bench_report [--repeat 3] [--out report.html] [--json results.json]

The test run is the real one of data_samples/ (40 epochs, the 10,000 test images); the
training run is synthetic logits (40 epochs, the first 50,000 training images' labels, some
flipped) since no real 50,000-sample training run is stored. Needs
/usr/share/datasets/fashion-mnist and /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import forgetkit as fk
from forgetkit.datasets import load_fashion_mnist
from forgetkit.report import build, explorer, to_html

from .common import machine

ROOT = Path(__file__).resolve().parents[1]
TEST_RUN = ROOT / "data_samples" / "fmnist_resnet18_sym20_h200_test.npz"
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]


def train_run(n=50_000, epochs=40, seed=0):
    """Synthetic training logits of the first ``n`` training images: labels with 20% flipped,
    each sample learned at its own pace, the flipped ones late or never."""
    _, y = load_fashion_mnist("train")
    rng = np.random.default_rng(seed)
    y = y[:n].copy()
    flip = rng.random(n) < 0.2
    y[flip] = (y[flip] + rng.integers(1, 10, flip.sum())) % 10
    pace = rng.uniform(0.1, 1.5, n) * np.where(flip, 0.3, 1.0)
    out = rng.normal(0, 1, (epochs, n, 10)).astype(np.float32)
    t = np.linspace(0, 1, epochs)[:, None]
    out[:, np.arange(n), y] += 4 * np.clip(t / pace[None, :], 0, 1)
    return fk.Run(out.astype(np.float16), y, sample_ids=np.arange(n),
                  class_names=fk.datasets.FASHION_MNIST_CLASSES)


def timed_loads(url, repeat, until):
    """Load ``url`` ``repeat`` times in a fresh page each: [(seconds from ``goto`` until
    ``until(page)`` returns, its value)]. Page errors raise."""
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=BROWSER_ARGS)
        for _ in range(repeat):
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            t0 = time.perf_counter()
            value = until(page)
            times.append((time.perf_counter() - t0, value))
            if errors:
                raise RuntimeError(f"page errors: {errors}")
            page.close()
        browser.close()
    return times


def first_card(page, url):
    """Open ``url#test-45`` and wait for its card. Returns the page's clock (s from the
    start of navigation) when the card was put in the page and when the frame showing it
    was painted."""
    page.goto(url + "#test-45", wait_until="commit")
    page.wait_for_selector("[data-testid=sample-card][data-sample-id='45']", state="visible",
                           timeout=60_000)
    page.wait_for_function("window.fkExplorer.firstCardPaintMs !== null")
    return page.evaluate("[fkExplorer.firstCardMs / 1000, fkExplorer.firstCardPaintMs / 1000]")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None, help="keep the report here")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    test = fk.load(TEST_RUN)
    train = train_run()
    x_test, _ = load_fashion_mnist("test")
    x_train, _ = load_fashion_mnist("train")
    tmp = Path(tempfile.mkdtemp())
    out = Path(args.out) if args.out else tmp / "report.html"
    # write_report's steps, so that the report without the explorer shares its figures
    test, train, inputs, train_inputs = explorer.prepare(
        test, train_run=train, inputs=x_test, train_inputs=x_train[:50_000])
    summary, table, kf, figures = build(test, seeds=(0,), train_run=train)
    c0 = time.process_time()
    samples = explorer.fragment(test, train_run=train, inputs=inputs, train_inputs=train_inputs)
    cpu = time.process_time() - c0
    out.write_text(to_html(test, summary, table, kf, figures, samples=samples), encoding="utf-8")
    size = out.stat().st_size
    plain = tmp / "plain.html"
    plain.write_text(to_html(test, summary, table, kf, figures), encoding="utf-8")
    cards = timed_loads(out.as_uri(), args.repeat, lambda page: first_card(page, out.as_uri()))
    base = [t for t, _ in timed_loads(plain.as_uri(), args.repeat,
                                      lambda page: page.goto(plain.as_uri(), wait_until="load"))]
    result = {
        "machine": machine(), "date": time.strftime("%Y-%m-%d"),
        "report_mb": size / 1e6, "plain_report_mb": plain.stat().st_size / 1e6,
        "explorer_fragment_cpu_s": cpu, "explorer_mb": len(samples.encode()) / 1e6,
        "first_card_wall_s": [c[0] for c in cards],
        "first_card_in_page_s": [c[1][0] for c in cards],
        "first_card_painted_s": [c[1][1] for c in cards],
        "plain_report_load_s": base,
        "median_first_card_s": statistics.median(c[0] for c in cards),
        "median_first_card_painted_s": statistics.median(c[1][1] for c in cards),
        "median_plain_load_s": statistics.median(base),
    }
    result["ratio"] = result["median_first_card_painted_s"] / result["median_plain_load_s"]
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
