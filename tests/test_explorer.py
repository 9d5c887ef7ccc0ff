"""The sample explorer (issue 26): inputs and class names, the encoded data, readable metadata,
notebook views, bad input, and the page itself in Chromium."""

import base64
import json
import re
import zlib

import numpy as np
import pandas as pd
import pytest

import forgetkit as fk
from forgetkit.cli import main
from forgetkit.report import explorer
from forgetkit.report.inputs import load_inputs, parse_class_names
from forgetkit.report.readable import duration, meta_rows

from .conftest import make_run

NAMES = ["alpha", "beta", "gamma", "delta", "epsilon"]
EVIL = "</script><script>window.__pwned = 1</script><b>bold?</b> & \u2028 done"


def small_runs(n_test=300, n_train=200):
    """A test run whose sample ids start at 100 (rows 100.. of its inputs) and a train run."""
    test = make_run(n_samples=n_test, seed=1)
    test = test.replace(sample_ids=np.arange(100, 100 + n_test), class_names=NAMES)
    train = make_run(n_samples=n_train, seed=2)
    return test, train


def images(n, seed=0, shape=(12, 10)):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 256, (n, *shape), dtype=np.uint8)


def texts(n):
    return [f"text of sample {i}" if i != 7 else EVIL for i in range(n)]


# ------------------------------------------------------------------ inputs and class names
def test_inputs_from_every_file_kind(tmp_path):
    img = images(5)
    np.save(tmp_path / "a.npy", img)
    np.savez(tmp_path / "b.npz", img)
    np.savez(tmp_path / "c.npz", images=img, labels=np.zeros(5))
    for name in ("a.npy", "b.npz", "c.npz"):
        got = load_inputs(tmp_path / name)
        assert got.kind == "images"
        np.testing.assert_array_equal(got.data, img)
    (tmp_path / "t.txt").write_text("one\ntwo <b>\nthree\n", encoding="utf-8")
    assert load_inputs(str(tmp_path / "t.txt")).data == ["one", "two <b>", "three"]
    frame = pd.DataFrame({"id": [0, 1], "text": ["x, y", "z"]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    assert load_inputs(tmp_path / "t.csv").data == ["x, y", "z"]
    assert load_inputs(tmp_path / "t.parquet").data == ["x, y", "z"]
    assert load_inputs(f"{tmp_path / 't.parquet'}:id").data == ["0", "1"]
    np.savez(tmp_path / "d.npz", a=img, b=img)
    with pytest.raises(fk.ForgetkitError, match="several arrays"):
        load_inputs(tmp_path / "d.npz")
    with pytest.raises(fk.ForgetkitError, match="no column 'nope'"):
        load_inputs(f"{tmp_path / 't.csv'}:nope")


def test_class_names_from_a_list_a_string_a_file_or_the_run(tmp_path):
    (tmp_path / "names.txt").write_text("a\nb\nc\n")
    assert parse_class_names(tmp_path / "names.txt", 3) == ["a", "b", "c"]
    assert parse_class_names("a, b,c", 3) == ["a", "b", "c"]
    assert parse_class_names(None, 3, run_names=["x", "y", "z"]) == ["x", "y", "z"]
    with pytest.raises(fk.ForgetkitError, match="must give 3 class names .* got 2"):
        parse_class_names("a,b", 3)


def test_thumbnails_average_blocks_and_keep_the_aspect():
    img = np.arange(2 * 4 * 6, dtype=np.float64).reshape(2, 4, 6) / 47
    small = explorer.thumbnails(img, 3)
    assert small.shape == (2, 2, 3, 1)
    full = explorer._to_uint8(img).astype(float)
    want = full.reshape(2, 2, 2, 3, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(small[..., 0], np.rint(want), atol=1)
    assert explorer.thumbnails(images(3, shape=(8, 8, 3)), 16).shape == (3, 8, 8, 3)


def decoded(record, blob, name):
    buf = zlib.decompress(base64.b64decode(blob))
    offset, size, dtype = record[name] if isinstance(record, dict) else record
    return np.frombuffer(buf, dtype=dtype, count=size, offset=offset)


def test_payload_holds_each_sample_by_its_input_row():
    test, train = small_runs()
    imgs = images(400)  # rows 100..399 belong to the test run's ids 100..399
    test, train, inputs, train_inputs = explorer.prepare(
        test, train_run=train, inputs=imgs, train_inputs=texts(200))
    record, blobs = explorer.payload(test, train_run=train, inputs=inputs,
                                     train_inputs=train_inputs)
    assert record["classes"] == NAMES
    t = record["runs"]["test"]
    assert t["ids"] == list(range(100, 400)) and t["kind"] == "images"
    np.testing.assert_array_equal(decoded(t["cols"], blobs["test"], "label"), test.labels)
    thumbs = decoded(t["thumbs"], blobs["test"], None).reshape(300, 12, 10)
    np.testing.assert_array_equal(thumbs, imgs[100:])
    p = decoded(t["cols"], blobs["test"], "traj_p").reshape(300, test.n_epochs)
    np.testing.assert_array_equal(p, np.rint(test.label_probs() * 255))
    preds = decoded(t["cols"], blobs["test"], "traj_pred").reshape(300, test.n_epochs)
    np.testing.assert_array_equal(preds, test.predictions().T)
    dyn = fk.sample_dynamics(test)
    forgotten = t["galleries"][0]
    assert forgotten["key"] == "forgotten" and forgotten["total"] == dyn["forgotten"].sum()
    assert sorted(test.sample_ids[forgotten["items"]]) == sorted(dyn.index[dyn["forgotten"]])
    tr = record["runs"]["train"]
    assert tr["ids"] is None and tr["kind"] == "texts" and tr["texts"][7] == EVIL


def test_script_json_cannot_end_its_script_element():
    text = explorer._script_json({"t": EVIL})
    assert "<" not in text and ">" not in text and "\u2028" not in text
    assert json.loads(text) == {"t": EVIL}


# ------------------------------------------------------------------ readable metadata
def test_metadata_reads_like_a_person_wrote_it():
    assert duration(409.3119921684265) == "6 min 49 s"
    assert duration(3.25) == "3.25 s" and duration(7384) == "2 h 3 min"
    rows = dict(meta_rows({"seconds": 409.3119921684265, "lr": 0.05, "final_acc": 0.952912,
                           "noise_mask": list(range(0, 3000, 3)), "model": "resnet18",
                           "width": None, "opt": {"name": "sgd", "momentum": 0.9}}))
    assert rows["seconds"] == "6 min 49 s"
    assert rows["lr"] == "0.05" and rows["final acc"] == "0.9529"
    assert rows["noise mask"] == "1,000 integers (0, 3, 6, …)"
    assert rows["width"] == "—" and rows["opt · momentum"] == "0.9"


# ------------------------------------------------------------------ notebooks
def test_run_repr_html_and_explore():
    run = make_run(n_samples=50).replace(class_names=NAMES)
    view = run._repr_html_()
    acc = fk.accuracy(run)[-1]
    for part in ("12 epochs × 50 samples × 5 classes", "logits (float32)", "0..11",
                 f"{100 * acc:.2f}%", "alpha, beta"):
        assert part in view
    shown = fk.explore(run, inputs=texts(50))._repr_html_()
    assert shown.startswith("<iframe srcdoc=\"") and "sandbox='allow-scripts'" in shown
    srcdoc = re.match(r'<iframe srcdoc="([^"]*)"', shown).group(1)
    assert "<" not in srcdoc and "&lt;script" in srcdoc  # the whole page, escaped


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("case, message", [
    ("few_rows", "has 399 rows; the run's largest sample id is 399, so it needs at least 400"),
    ("shape", r"images must have shape \(n, height, width\) or \(n, height, width, 3\); "
              r"got shape \(400, 12, 10, 4\)"),
    ("names", "must give 5 class names .* got 4"),
    ("few_lines", "has 150 rows; the run has 200 samples and no sample ids .* needs at least 200"),
])
def test_bad_input_fails_before_anything_is_written(tmp_path, case, message, capsys):
    test, train = small_runs()
    fk.save(test, tmp_path / "test.npz")
    fk.save(train, tmp_path / "train.npz")
    np.save(tmp_path / "img.npy", images(400))
    (tmp_path / "t.txt").write_text("\n".join(texts(200)) + "\n")
    args = ["--inputs", str(tmp_path / "img.npy"), "--train-inputs", str(tmp_path / "t.txt")]
    if case == "few_rows":
        np.save(tmp_path / "img.npy", images(399))
    elif case == "shape":
        np.save(tmp_path / "img.npy", images(400, shape=(12, 10, 4)))
    elif case == "names":
        args += ["--class-names", "a,b,c,d"]
    else:
        (tmp_path / "t.txt").write_text("\n".join(texts(150)) + "\n")
    out = tmp_path / "r.html"
    code = main(["report", str(tmp_path / "test.npz"), "--train-run", str(tmp_path / "train.npz"),
                 "--seeds", "0", "-o", str(out), "--quiet", *args])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err
    assert not out.exists() and list(tmp_path.glob("r.html*")) == []
    # the library says the same
    with pytest.raises(fk.ForgetkitError, match=message):
        fk.write_report(fk.load(tmp_path / "test.npz"), out, seeds=(0,),
                        train_run=fk.load(tmp_path / "train.npz"),
                        inputs=tmp_path / "img.npy", train_inputs=tmp_path / "t.txt",
                        class_names="a,b,c,d" if case == "names" else None)
    assert not out.exists()


def test_cli_report_with_inputs_class_names_and_readable_metadata(tmp_path):
    test, train = small_runs()
    fk.save(test.replace(class_names=None, meta={"seconds": 409.3119921684265}),
            tmp_path / "test.npz")
    fk.save(train, tmp_path / "train.npz")
    np.save(tmp_path / "img.npy", images(400))
    (tmp_path / "names.txt").write_text("\n".join(NAMES) + "\n")
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "test.npz"), "--train-run", str(tmp_path / "train.npz"),
                 "--seeds", "0", "-o", str(out), "--quiet", "--inputs", str(tmp_path / "img.npy"),
                 "--class-names", str(tmp_path / "names.txt")]) == 0
    text = out.read_text()
    record = json.loads(re.search(r"id='fk-data'>(.*?)</script>", text).group(1))
    assert record["classes"] == NAMES
    assert record["runs"]["test"]["kind"] == "images" and record["runs"]["train"]["kind"] is None
    assert "http" not in text.replace("http-equiv", "")  # offline: nothing fetched
    assert "6 min 49 s" in text and "409.31" not in text  # metadata as a readable table
    assert "data-testid='run-metadata'" in text


# ------------------------------------------------------------------ in the browser
@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    test, train = small_runs()
    path = tmp_path_factory.mktemp("explorer") / "explorer.html"
    piece, explorer.BLOB_PIECE = explorer.BLOB_PIECE, 4096  # each run's data in many pieces
    try:
        page = fk.explore(test, train_run=train, inputs=images(400), train_inputs=texts(200))
    finally:
        explorer.BLOB_PIECE = piece
    assert page.html.count("class='fk-blob-test'") > 2
    page.save(path)
    return path, test, train


@pytest.fixture()
def open_page(browser, page_file):
    pages = []

    def opener(fragment=""):
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        page.on("dialog", lambda d: page.errors.append("dialog " + d.message))
        page.goto(page_file[0].as_uri() + fragment)
        page.wait_for_selector("#fk-explorer[data-ready=true]", timeout=20_000)
        pages.append(page)
        return page

    yield opener
    for page in pages:
        assert page.errors == []
        assert page.evaluate("window.__pwned") is None
        page.close()


def card_of(page):
    card = page.locator("[data-testid=sample-card]")
    card.wait_for(state="visible")
    return card


def image_pixels(page):
    """Sum of the card image's pixel values, read back from its canvas."""
    return page.evaluate("""() => { const c = document.querySelector(
        '[data-testid=sample-card] [data-testid=sample-image]');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let s = 0; for (let i = 0; i < d.length; i += 4) s += d[i];
        return [c.width, c.height, s]; }""")


def test_fragment_opens_the_card_with_id_labels_and_image(open_page, page_file):
    _, test, _ = page_file
    page = open_page("#test-145")
    card = card_of(page)
    assert card.get_attribute("data-run") == "test"
    assert card.get_attribute("data-sample-id") == "145"
    assert "test sample 145" in card.locator("[data-testid=card-title]").inner_text()
    table = card.locator("[data-testid=card-table]").inner_text()
    assert f"given label\t{NAMES[test.labels[45]]}" in table
    assert "suggested label\t" in table
    w, h, total = image_pixels(page)
    img = images(400)[145]
    assert (w, h) == (10, 12) and total == int(img.sum())  # that sample's own image
    trajectory = card.locator("[data-testid=predicted-classes]").inner_text()
    assert NAMES[int(test.predictions()[-1, 45])] in trajectory


def test_clicking_a_gallery_item_and_the_keyboard(open_page):
    page = open_page()
    items = page.locator("[data-testid=gallery-item][data-run=test]")
    first, second = items.nth(0), items.nth(1)
    want = first.get_attribute("data-sample-id")
    first.click()
    assert card_of(page).get_attribute("data-sample-id") == want
    assert page.evaluate("location.hash") == f"#test-{want}"
    first.focus()
    page.keyboard.press("ArrowRight")  # with a card open, the card follows the focus
    want2 = second.get_attribute("data-sample-id")
    assert page.locator("[data-testid=sample-card]").get_attribute("data-sample-id") == want2
    page.keyboard.press("Escape")
    assert page.locator("[data-testid=sample-card]").is_hidden()
    page.keyboard.press("Enter")  # focus went back to the item
    assert card_of(page).get_attribute("data-sample-id") == want2


def test_clicking_a_point_of_the_data_map(open_page, page_file):
    _, test, _ = page_file
    page = open_page()
    points = np.array(page.evaluate(
        f"Array.from({{length: {test.n_samples}}}, (_, i) => fkExplorer.toScreen('test', i))"))
    d = np.hypot(*(points[:, None, :] - points[None, :, :]).transpose(2, 0, 1))
    np.fill_diagonal(d, np.inf)
    i = int(np.argmax(d.min(axis=1)))  # the point farthest from any other
    assert d[i].min() > 3
    page.mouse.move(*points[i])
    assert page.locator(".fk-tip").is_visible()
    page.mouse.click(*points[i])
    card = card_of(page)
    assert card.get_attribute("data-sample-id") == str(test.sample_ids[i])
    assert image_pixels(page)[2] == int(images(400)[test.sample_ids[i]].sum())


def test_text_is_shown_as_data_never_markup(open_page):
    page = open_page("#train-7")
    card = card_of(page)
    assert card.get_attribute("data-run") == "train"
    assert card.locator("[data-testid=sample-text]").text_content() == EVIL
    assert page.locator("[data-testid=sample-card] b").count() == 0


def test_filters_select_the_gallery_items(open_page, page_file):
    _, test, _ = page_file
    page = open_page()
    page.select_option("[data-testid=class-filter]", "2")  # value = class index
    ids = page.eval_on_selector_all("[data-testid=gallery-item][data-run=test]",
                                    "els => els.map(e => +e.dataset.sampleId)")
    assert ids and all(test.labels[i - 100] == 2 for i in ids)
    page.select_option("[data-testid=region-filter]", "0")  # easy-to-learn
    regions = fk.data_map(test)["region"]
    ids = page.eval_on_selector_all("[data-testid=gallery-item][data-run=test]",
                                    "els => els.map(e => +e.dataset.sampleId)")
    assert all(regions.loc[i] == "easy-to-learn" and test.labels[i - 100] == 2 for i in ids)


def test_a_box_dragged_on_the_data_map_filters_the_galleries(open_page, page_file):
    _, test, _ = page_file
    page = open_page()
    points = np.array(page.evaluate(
        f"Array.from({{length: {test.n_samples}}}, (_, i) => fkExplorer.toScreen('test', i))"))
    box = page.locator("[data-testid=data-map]").bounding_box()
    cut = float(np.median(points[:, 0]))
    page.mouse.move(box["x"] + 2, box["y"] + 2)
    page.mouse.down()
    page.mouse.move(cut, box["y"] + box["height"] / 2, steps=4)
    page.mouse.move(cut, box["y"] + box["height"] - 2, steps=4)
    page.mouse.up()
    assert page.locator("[data-testid=sample-card]").is_hidden()  # a drag is not a click
    ids = page.eval_on_selector_all("[data-testid=gallery-item][data-run=test]",
                                    "els => els.map(e => +e.dataset.sampleId)")
    inside = {int(test.sample_ids[i]) for i in np.flatnonzero(points[:, 0] <= cut + 0.5)}
    assert ids and set(ids) <= inside
    page.click("[data-testid=clear-box]")
    after = page.eval_on_selector_all("[data-testid=gallery-item][data-run=test]",
                                      "els => els.map(e => +e.dataset.sampleId)")
    assert len(after) > len(ids)


def test_explore_runs_inline_in_a_notebook_frame(browser):
    run = make_run(n_samples=60).replace(class_names=NAMES)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content("<h1>a notebook cell</h1>" + fk.explore(run, inputs=texts(60))._repr_html_())
    frame = page.frames[1]  # the iframe's srcdoc: its own sandboxed document
    frame.wait_for_selector("#fk-explorer[data-ready=true]", timeout=20_000)
    item = frame.locator("[data-testid=gallery-item]").first
    want = item.get_attribute("data-sample-id")
    item.click()
    assert frame.get_attribute("[data-testid=sample-card]", "data-sample-id") == want
    assert errors == []
    page.close()


def test_small_thumbnails_keep_sharp_images_for_the_gallery_heads(monkeypatch, browser,
                                                                   tmp_path):
    monkeypatch.setattr(explorer, "THUMB_BUDGET", 16 * 300)  # 4 x 4 thumbnails
    test, _ = small_runs()
    imgs = images(400)
    test, _, inputs, _ = explorer.prepare(test, inputs=imgs)
    record, blobs = explorer.payload(test, inputs=inputs)
    t = record["runs"]["test"]
    assert t["thumb"] == [4, 3, 1] and t["sharp"]["shape"] == [12, 10, 1]
    heads = [i for g in t["galleries"] for i in g["items"][:explorer.SHARP_PER_GALLERY]]
    assert t["sharp"]["index"] == list(dict.fromkeys(heads))
    sharp = decoded(t["sharp"]["data"], blobs["test"], None).reshape(-1, 12, 10)
    np.testing.assert_array_equal(sharp, imgs[100 + np.array(t["sharp"]["index"])])
    # in the page, a gallery item's card shows its sharp image
    path = tmp_path / "e.html"
    fk.explore(test, inputs=imgs).save(path)
    page = browser.new_page()
    page.goto(path.as_uri())
    page.wait_for_selector("#fk-explorer[data-ready=true]")
    item = page.locator("[data-testid=gallery-item]").first
    sid = int(item.get_attribute("data-sample-id"))
    item.click()
    card_of(page)
    assert image_pixels(page) == [10, 12, int(imgs[sid].sum())]
    page.close()


def test_inputs_need_the_html_report(tmp_path):
    run = make_run(n_samples=40)
    with pytest.raises(fk.ForgetkitError, match="HTML report's sample explorer"):
        fk.write_report(run, tmp_path / "figs", fmt="png", inputs=texts(40))
    assert not (tmp_path / "figs").exists()
