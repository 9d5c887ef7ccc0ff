"""Fuzzing every loader and `apply` with corrupted files (issue 13).

Each case truncates a file, flips bits in it, or replaces a field of its metadata or plan
with an arbitrary JSON value. The outcome must be one of:

- the file is refused with forgetkit's error (`forgetkit.ForgetkitError`), or
- it loads what the file states: the outputs and labels equal the original (checksums
  refuse any flipped bit, issue 25; only a Dataset Cartography folder, which has none, may
  load an element whose stored bytes a flipped bit changed, at most one per flipped bit);
  a truncated run may keep fewer epochs, never other ones;

never garbage (values that were not in the file), a crash, or, from the command line, a
traceback (exit status 1 with one line, never the internal-error status).

Issue 38 adds the metadata (sample ids, class names, meta, kind, sizes) to what must load
equal or be refused, mutations of metadata keys (renamed, dropped, changed) and NPZ
members, and that `forgetkit.verify` and ``forgetkit verify`` agree with `load` on every
mutation.

Small runs keep each case to milliseconds; examples are derandomized so CI sees the same
cases every time, and the whole file runs in well under a minute.
"""

import functools
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forgetkit as fk
from forgetkit.cli import EXIT_BUG, main
from forgetkit.kinds import kind_of
from forgetkit.kinds.topk import TopKOutputs, topk_records

E, N, C = 3, 12, 3
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=8)


def original_run():
    rng = np.random.default_rng(5)
    values = rng.normal(size=(E, N, C)).astype(np.float32)
    return fk.Run(values, rng.integers(0, C, N), epochs=[1, 3, 7])


RUN = original_run()
VALUES = np.asarray(RUN.outputs)


def write_format(folder, fmt, run=None):
    """Write ``run`` (default RUN; a cartography folder always holds RUN) in format ``fmt``
    into ``folder``; returns the path to load."""
    run = RUN if run is None else run
    folder = Path(folder)
    if fmt == "cartography":
        path = folder / "carto"
        path.mkdir()
        for e, epoch in enumerate(RUN.epochs):
            with open(path / f"dynamics_epoch_{epoch}.jsonl", "w") as f:
                for n in range(N):
                    f.write(json.dumps({"guid": f"g{n}", f"logits_epoch_{epoch}":
                                        VALUES[e, n].tolist(), "gold": int(RUN.labels[n])})
                            + "\n")
        return path
    if fmt == "summary":
        return fk.summarize(run, folder / "summary.npy").source
    if fmt == "summary-parquet":
        return fk.summarize(run, folder / "summary.parquet").source
    if fmt in ("topk", "topk-parquet"):
        path = folder / ("topk.npy" if fmt == "topk" else "topk.parquet")
        fk.save(topk_run(run), path)
        return path
    suffix, layout = {"npz": (".npz", "list"), "npy": (".npy", "list"),
                      "parquet-list": (".parquet", "list"),
                      "parquet-binary": (".parquet", "binary")}[fmt]
    path = folder / f"run{suffix}"
    fk.save(run, path, layout=layout)
    return path


FORMATS = ["npz", "npy", "parquet-list", "parquet-binary", "cartography", "summary",
           "summary-parquet", "topk", "topk-parquet"]
#: The summary records of RUN (a summary holds these, not the outputs).
SUMMARY = fk.summarize(RUN).outputs.records
TOP_K = 2


def topk_run(run):
    """The top-k run (k = TOP_K) of ``run``'s logits, tokens in sequences of 4."""
    records = np.stack([topk_records(run.epoch_values(e), run.labels, TOP_K)
                        for e in range(run.n_epochs)])
    return fk.Run(TopKOutputs(records, run.n_classes, np.arange(run.n_samples) // 4,
                              np.arange(run.n_samples) % 4), run.labels, kind="topk",
                  epochs=run.epochs)


#: The top-k records of RUN.
TOPK = topk_run(RUN).outputs.records


def record_values(records):
    """Structured records (E, N) as float64 (E, N, fields), sub-arrays flattened."""
    return np.concatenate([np.asarray(records[f], dtype=np.float64).reshape(
        *records.shape, -1) for f in records.dtype.names], axis=-1)


#: The width of each kind of stored values per (epoch, sample): outputs, summary, top-k.
WIDTHS = {C: VALUES, 4: record_values(SUMMARY), 2 + 2 * TOP_K: record_values(TOPK)}


def files_of(path):
    """The files that make up a stored run (the run and its sidecar, or the folder's)."""
    if path.is_dir():
        return sorted(path.iterdir())
    return sorted(p for p in path.parent.iterdir() if p.is_file() and not
                  p.name.endswith(".lock"))


def outcome(path):
    """The loaded (values, labels, epochs) of ``path``, or None if forgetkit refused it.
    Any other exception propagates (and fails the test)."""
    try:
        run = fk.load(path)
        if not kind_of(run).stores_values:  # records (E, N), compared as (E, N, fields)
            values = record_values(np.asarray(run.outputs.records))
        else:
            values = np.asarray(run.outputs, dtype=np.float32)
        run.predictions()  # the read path of every analysis, checked per read
        return values, run.labels, run.epochs
    except fk.ForgetkitError:
        return None


def original_values(k, width):
    """The first ``k`` epochs of RUN's outputs (width C), or of its summary (4) or top-k
    records (2 + 2 TOP_K) as (k, N, width)."""
    return WIDTHS[width][:k]


def check_loaded_equals(result, flipped):
    """A loaded run differs from RUN in at most ``flipped`` elements, epochs a prefix."""
    if result is None:
        return
    values, labels, epochs = result
    k = values.shape[0]
    assert values.shape[1] == N and values.shape[2] in WIDTHS and 1 <= k <= E
    assert epochs.tolist() == RUN.epochs[:k].tolist()
    changed = int(np.sum(values != original_values(k, values.shape[2])))
    changed += int(np.sum(labels != RUN.labels))
    assert changed <= flipped, f"{changed} values changed by {flipped} flipped bits"
    assert np.isfinite(values).all()


def check_cli(path, capsys):
    """The command line on the same file: success, or one line and exit status 1."""
    capsys.readouterr()
    status = main(["analyze", str(path), "--quiet"])
    err = capsys.readouterr().err
    assert status in (0, 1), err
    assert status != EXIT_BUG and "Traceback" not in err
    if status == 1:
        assert len(err.strip().splitlines()) == 1, err


CORRUPTIONS = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 1.0)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0.0, 1.0),
                                                  st.integers(0, 7)), min_size=1, max_size=3)),
)


def corrupt(file, corruption):
    """Apply a corruption to ``file``; returns the number of bits flipped."""
    data = bytearray(file.read_bytes())
    kind, arg = corruption
    if kind == "truncate":
        file.write_bytes(bytes(data[: int(arg * len(data))]))
        return 0
    if not data:
        return 0
    for where, bit in arg:
        data[min(int(where * len(data)), len(data) - 1)] ^= 1 << bit
    file.write_bytes(bytes(data))
    return len(arg)


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(which=st.integers(0, 10), corruption=CORRUPTIONS)
def test_corrupted_files_load_equal_data_or_are_refused(fmt, which, corruption, capsys):
    with tempfile.TemporaryDirectory() as folder:
        path = write_format(folder, fmt)
        files = files_of(path)
        flipped = corrupt(files[which % len(files)], corruption)
        # every format forgetkit writes carries checksums (NPZ: the zip's CRC-32), so a
        # flipped bit is refused; a Dataset Cartography folder (another tool's) has none
        check_loaded_equals(outcome(path), flipped if fmt == "cartography" else 0)
        check_cli(path, capsys)


# ------------------------------------------------------------- metadata mutations
def mutate_record(record, field, value, drop):
    record = dict(record)
    if drop:
        record.pop(field, None)
    else:
        record[field] = value
    return record


RECORD_FIELDS = ["kind", "dtype", "n_samples", "n_classes", "epochs", "labels", "sample_ids",
                 "class_names", "meta", "format", "version", "layout"]
MUTATIONS = dict(field=st.sampled_from(RECORD_FIELDS), drop=st.booleans(),
                 value=st.one_of(JSON_VALUES, st.lists(st.integers(-3, 20), min_size=N - 1,
                                                       max_size=N + 1)))


def check_states(result, field, value):
    """A run loaded from a changed record holds the original outputs, and the labels and
    epochs the record states."""
    if result is None:
        return
    values, labels, epochs = result
    np.testing.assert_array_equal(values, original_values(*values.shape[::2]))
    stated = value if field == "labels" else RUN.labels.tolist()
    assert labels.tolist() == stated
    if field != "epochs":
        assert epochs.tolist() == RUN.epochs[: len(epochs)].tolist()


@pytest.mark.parametrize("fmt", ["npy", "summary"])
@FUZZ
@given(**MUTATIONS)
def test_sidecar_mutations(fmt, field, value, drop, capsys):
    with tempfile.TemporaryDirectory() as folder:
        path = write_format(folder, fmt)
        sidecar = path.with_name(path.stem + ".forgetkit.json")
        record = mutate_record(json.loads(sidecar.read_text()), field, value, drop)
        sidecar.write_text(json.dumps(record))
        check_states(outcome(path), field, None if drop else value)
        check_cli(path, capsys)


@pytest.mark.parametrize("fmt", ["topk", "topk-parquet"])
@FUZZ
@given(field=st.sampled_from(RECORD_FIELDS + ["vocab_size", "k", "tokens", "fields"]),
       drop=st.booleans(), value=MUTATIONS["value"])
def test_topk_record_mutations(fmt, field, value, drop, capsys):
    # a top-k run's labels are its token table's targets, never the record's
    with tempfile.TemporaryDirectory() as folder:
        path = write_format(folder, fmt)
        if fmt == "topk":
            sidecar = path.with_name(path.stem + ".forgetkit.json")
            sidecar.write_text(json.dumps(mutate_record(json.loads(sidecar.read_text()),
                                                        field, value, drop)))
        else:
            table, sums = pq.read_table(path), pq.read_metadata(path).metadata
            record = mutate_record(json.loads(table.schema.metadata[b"forgetkit"]), field,
                                   value, drop)
            pq.write_table(table.replace_schema_metadata(
                {b"forgetkit": json.dumps(record).encode(),
                 b"forgetkit.crc32c": sums[b"forgetkit.crc32c"]}), path, row_group_size=N)
        check_states(outcome(path), "targets", None)
        check_cli(path, capsys)


@pytest.mark.parametrize("layout", ["list", "binary"])
@FUZZ
@given(**MUTATIONS)
def test_parquet_metadata_mutations(layout, field, value, drop, capsys):
    with tempfile.TemporaryDirectory() as folder:
        path = write_format(folder, f"parquet-{layout}")
        table = pq.read_table(path)
        record = mutate_record(json.loads(table.schema.metadata[b"forgetkit"]), field, value,
                               drop)
        pq.write_table(table.replace_schema_metadata(
            {b"forgetkit": json.dumps(record).encode()}), path, row_group_size=N)
        check_states(outcome(path), field, None if drop else value)
        check_cli(path, capsys)


@FUZZ
@given(field=st.sampled_from(["labels", "epochs", "sample_ids", "class_names", "meta",
                              "logits"]), value=JSON_VALUES)
def test_npz_member_mutations(field, value):
    with tempfile.TemporaryDirectory() as folder:
        path = write_format(folder, "npz")
        with np.load(path) as z:
            arrays = dict(z)
        if field == "meta":
            arrays["meta"] = np.array(json.dumps(value))
        else:
            try:
                arrays[field] = np.asarray(value)
            except ValueError:  # ragged: numpy cannot even build it
                return
            if arrays[field].dtype == object:
                return  # numpy cannot store it without pickle
        np.savez(path, **arrays)
        result = outcome(path)
        if result is not None and field not in ("labels", "epochs", "logits"):
            np.testing.assert_array_equal(result[0], VALUES)
            assert result[1].tolist() == RUN.labels.tolist()
        if result is not None:
            assert np.isfinite(result[0]).all()


# --------------------------------------------------------------------- plans
def fusers():
    return [fk.KnowledgeFusion(), fk.LikelihoodFusion(), fk.EnsembleSelection(),
            fk.CheckpointAverage("horizontal", max_checkpoints=2), fk.EarlyStopping()]


N_RECORDS = len(fusers())


@functools.cache
def fitted_records():
    """Each fuser's plan fitted on the original run, as JSON values: fitted on first use,
    not at collection (where each pytest-xdist worker would compile the fits' kernels)."""
    run = original_run()
    return [json.loads(f.fit(run).to_json()) for f in fusers()]


def paths_of(value, prefix=()):
    """Every path (tuple of keys and indices) into a JSON value."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths_of(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths_of(v, prefix + (i,))


def replaced(value, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    out = dict(value) if isinstance(value, dict) else list(value)
    out[head] = replaced(value[head], rest, new)
    return out


def check_fused(probs):
    """Fused probabilities: finite, in [0, 1], rows summing to 1."""
    assert probs.shape == (N, C)
    assert np.isfinite(probs).all() and (probs >= 0).all() and (probs <= 1 + 1e-12).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)


def check_apply(text, capsys):
    """Load the fuser from ``text`` and apply it, through the library and the CLI."""
    try:
        fuser = fk.load_fuser(text)
    except fk.ForgetkitError:
        fuser = None
    if fuser is not None:
        try:
            check_fused(fuser.predict_proba(RUN))
        except fk.ForgetkitError:
            pass
    with tempfile.TemporaryDirectory() as folder:
        plan, run, out = Path(folder, "plan.json"), Path(folder, "run.npz"), \
            Path(folder, "fused.npy")
        plan.write_text(text)
        fk.save(RUN, run)
        capsys.readouterr()
        status = main(["apply", str(plan), str(run), "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert status in (0, 1) and "Traceback" not in err, err
        if status == 0:
            check_fused(np.load(out))
        else:
            assert len(err.strip().splitlines()) == 1 and not out.exists()


@FUZZ
@given(data=st.data(), which=st.integers(0, N_RECORDS - 1), value=JSON_VALUES)
def test_plan_mutations(data, which, value, capsys):
    record = fitted_records()[which]
    path = data.draw(st.sampled_from(list(paths_of(record))))
    check_apply(json.dumps(replaced(record, path, value)), capsys)


@FUZZ
@given(which=st.integers(0, N_RECORDS - 1), corruption=CORRUPTIONS)
def test_plan_file_corruptions(which, corruption, capsys):
    with tempfile.TemporaryDirectory() as folder:
        plan = Path(folder, "plan.json")
        plan.write_text(json.dumps(fitted_records()[which]))
        corrupt(plan, corruption)
        text = plan.read_bytes().decode("utf-8", errors="replace")
    check_apply(text if text.strip() else " ", capsys)


def test_fuzz_helpers_see_the_original_as_equal():
    with tempfile.TemporaryDirectory() as folder:
        for fmt in FORMATS:
            sub = Path(folder, fmt)
            sub.mkdir()
            result = outcome(write_format(sub, fmt))
            assert result is not None
            check_loaded_equals(result, 0)


# ------------------------------------------------- verify agrees with load (issue 38)
#: RUN with the metadata every format stores: sample ids, class names, metadata.
RICH = RUN.replace(sample_ids=[f"s{i}" for i in range(N)], class_names=["a", "b", "c"],
                   meta={"lr": 0.5, "note": "x"})


def topk_rich():
    return topk_run(RICH).replace(meta=RICH.meta)


def write_rich(folder, fmt):
    """RICH (its top-k run for the top-k formats) in format ``fmt``; returns the path."""
    if fmt in ("topk", "topk-parquet"):
        path = Path(folder) / ("topk.npy" if fmt == "topk" else "topk.parquet")
        fk.save(topk_rich(), path)
        return path
    return write_format(folder, fmt, RICH)


def state(run):
    """Everything a loaded run states that changes a result."""
    if not kind_of(run).stores_values:
        values = record_values(np.asarray(run.outputs.records))
    else:
        values = np.asarray(run.outputs, dtype=np.float32)
    run.predictions()  # every epoch read, as every analysis does
    ids = None if run.sample_ids is None else [str(i) for i in run.sample_ids]
    return dict(values=values, labels=run.labels.tolist(), epochs=run.epochs.tolist(),
                ids=ids, class_names=None if run.class_names is None else
                list(run.class_names), meta=run.meta, kind=run.kind,
                n_classes=run.n_classes)


def one_line(err):
    text = str(err)
    assert text and "\n" not in text.strip(), text
    assert "Traceback" not in text


def loaded_state(path):
    """The state of the run `fk.load` gives (every epoch read), or None if refused."""
    try:
        return state(fk.load(path))
    except fk.ForgetkitError as err:
        one_line(err)
        return None


def verify_accepts(path):
    """Whether `fk.verify` finds nothing wrong (an error is one line)."""
    try:
        return not fk.verify(path)["bad"]
    except fk.ForgetkitError as err:
        one_line(err)
        return False


def check_agreement(path, fmt, original, capsys):
    """Equal data or a refusal, and `verify` (and `forgetkit verify`) agree with `load`."""
    got = loaded_state(path)
    accepted = verify_accepts(path)
    assert accepted == (got is not None), (got is not None, accepted)
    capsys.readouterr()
    status = main(["verify", str(path)])
    err = capsys.readouterr().err
    assert status == (0 if accepted else 1), err
    assert "Traceback" not in err
    if got is None or fmt == "cartography":  # no checksums: a flipped value may load
        return
    k = len(got["epochs"])
    assert got["epochs"] == original["epochs"][:k] and k >= 1
    np.testing.assert_array_equal(got["values"], original["values"][:k])
    assert {n: v for n, v in got.items() if n not in ("values", "epochs")} == \
        {n: v for n, v in original.items() if n not in ("values", "epochs")}


@functools.cache
def original_state(fmt):
    with tempfile.TemporaryDirectory() as folder:
        return state(fk.load(write_rich(folder, fmt)))


def json_files(path):
    """The JSON metadata of a run: its sidecar files, or a Parquet file's schema record."""
    return [p for p in files_of(path) if p.suffix == ".json"]


def mutate_key(record, which, how, value):
    """``record`` with its key number ``which`` renamed by one character, dropped or given
    ``value``."""
    keys = sorted(record)
    key = keys[which % len(keys)]
    record = dict(record)
    if how == "rename":
        record[key[:-1] + chr(ord(key[-1]) ^ 1)] = record.pop(key)
    elif how == "drop":
        del record[key]
    else:
        record[key] = value
    return record


@pytest.mark.parametrize("fmt", FORMATS)
@settings(FUZZ, max_examples=30)
@given(which=st.integers(0, 10), corruption=CORRUPTIONS)
def test_verify_agrees_with_load_on_corrupted_bytes(fmt, which, corruption, capsys):
    with tempfile.TemporaryDirectory() as folder:
        path = write_rich(folder, fmt)
        files = files_of(path)
        corrupt(files[which % len(files)], corruption)
        check_agreement(path, fmt, original_state(fmt), capsys)


@pytest.mark.parametrize("fmt", ["npy", "summary", "topk", "parquet-list", "parquet-binary",
                                 "summary-parquet", "topk-parquet"])
@settings(FUZZ, max_examples=30)
@given(which=st.integers(0, 30), how=st.sampled_from(["rename", "drop", "value"]),
       value=JSON_VALUES)
def test_verify_agrees_with_load_on_changed_metadata_keys(fmt, which, how, value, capsys):
    with tempfile.TemporaryDirectory() as folder:
        path = write_rich(folder, fmt)
        if path.suffix == ".npy":
            sidecar = path.with_name(path.stem + ".forgetkit.json")
            sidecar.write_text(json.dumps(mutate_key(json.loads(sidecar.read_text()), which,
                                                     how, value)))
        else:
            stored = pq.read_metadata(path).metadata
            md = {k: v for k, v in stored.items() if k != b"ARROW:schema"}
            key = sorted(md)[which % len(md)]  # the record, or the checksums
            md[key] = json.dumps(mutate_key(json.loads(md[key]), which // len(md), how,
                                            value)).encode()
            pq.write_table(pq.read_table(path).replace_schema_metadata(md), path,
                           row_group_size=N)
        check_agreement(path, fmt, original_state(fmt), capsys)


@settings(FUZZ, max_examples=30)
@given(member=st.sampled_from(["labels", "epochs", "sample_ids", "class_names", "meta",
                               "logits", "forgetkit"]),
       how=st.sampled_from(["rename", "drop", "value"]), value=JSON_VALUES)
def test_verify_agrees_with_load_on_changed_npz_members(member, how, value, capsys):
    with tempfile.TemporaryDirectory() as folder:
        path = write_rich(folder, "npz")
        with np.load(path) as z:
            arrays = dict(z)
        if how == "rename":
            arrays[member[:-1] + chr(ord(member[-1]) ^ 1)] = arrays.pop(member)
        elif how == "drop":
            del arrays[member]
        else:
            try:
                arrays[member] = np.asarray(json.dumps(value) if member in ("meta", "forgetkit")
                                            else value)
            except ValueError:  # ragged: numpy cannot even build it
                return
            if arrays[member].dtype == object:
                return  # numpy cannot store it without pickle
        np.savez(path, **arrays)
        check_agreement(path, "npz", original_state("npz"), capsys)
