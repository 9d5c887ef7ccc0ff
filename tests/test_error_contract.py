"""The error contract (forgetkit/errors.py): every error about a user's input is a
`ForgetkitError` whose message names the argument (or the file) it is about, and every CLI
command turns a bad file or value into one line on stderr, never a traceback.

Generated from the public surface (`tests.test_api_docs.public_objects`, the names and
signatures docs/api.md lists): every public function and class is called with wrong types and
bad values for its required arguments; methods are called on valid instances (a run, a fitted
fuser of each kind, the writers, the explorer) with bad arguments; every subcommand of
`forgetkit.cli.build_parser` is run on a bad file and with bad option values.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import re
import warnings

import numpy as np
import pytest

import forgetkit as fk
from forgetkit import cli

from .test_api_docs import public_objects

#: A wrong type, a string that is no option, file or number, a nested list of the wrong shape.
BAD = (5, "nope", [[1, 2]])

#: Calls that are valid (path, repr of the bad value) -> why.
VALID = {
    ("forgetkit.evaluate.percent", "5"): "formats the number 5 as '500.00%'",
    ("forgetkit.split_indices", "5"): "splits 5 samples in halves (val_frac has a default)",
    ("forgetkit.report.Explorer", "'nope'"): "the HTML text of an explorer is any string",
    ("forgetkit.io.atomic_write", "'nope'"): "a context manager for the file 'nope', idle "
                                             "until entered",
    ("forgetkit.linear.pca", "[[1, 2]]"): "a data matrix of 1 sample and 2 features",
    ("forgetkit.linear.optimal_separator", "[[1, 2]]"): "X (1, 2) with one-hot targets (1, 2)",
    ("forgetkit.linear.simulate_deep_linear", "[[1, 2]]"):
        "X (1, 2) with targets (1, 2): a network of one sample",
    ("KnowledgeFusion.with_windows", "5"): "KF(5) of a plan of fewer windows is the whole plan",
    ("Explorer.save", "'nope'"): "writes the page to the file 'nope'",
}
#: Result records built by forgetkit, whose fields are whatever the analysis computed.
RECORDS = {"forgetkit.analysis.DoubleDescent"}

def _required(fn, skip_first=False):
    """Names of the parameters of ``fn`` that have no default (self left out for methods)."""
    params = list(inspect.signature(fn).parameters.values())[int(skip_first):]
    return [p for p in params if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _call(fn, params, bad):
    args = [bad for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kwargs = {p.name: bad for p in params if p.kind == p.KEYWORD_ONLY}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*args, **kwargs)
        if inspect.isgenerator(out):  # a lazy result must have checked its arguments already
            out.close()
    return out


def _assert_refused(fn, params, bad, where):
    """``fn`` called with ``bad`` for every parameter in ``params`` raises a ForgetkitError
    naming one of them (or the bad path itself)."""
    try:
        _call(fn, params, bad)
    except fk.ForgetkitError as err:
        message = str(err)
        names = [p.name for p in params]
        assert any(n in message for n in names) or (isinstance(bad, str) and bad in message), \
            f"{where}({bad!r}): {type(err).__name__}: {message!r} names none of {names}"
        assert "\n" not in message.strip(), f"{where}({bad!r}): not one line: {message!r}"
        return
    except Exception as err:  # noqa: BLE001 (the contract: nothing but ForgetkitError)
        pytest.fail(f"{where}({bad!r}) raised {type(err).__name__}: {err}"[:400])
    pytest.fail(f"{where}({bad!r}) raised nothing")


def _functions():
    """(path, function or class) of every public function and class taking required
    arguments (methods are tested on instances below)."""
    out = []
    for path, obj in public_objects():
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or path in RECORDS:
            continue
        if inspect.isfunction(obj) and "." in obj.__qualname__:  # a method
            continue
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        try:
            params = _required(obj.__init__ if inspect.isclass(obj) else obj,
                               skip_first=inspect.isclass(obj))
        except (TypeError, ValueError):
            continue
        if params:
            out.append((path, obj, params))
    return out


FUNCTIONS = _functions()


def _cases():
    for path, obj, params in FUNCTIONS:
        for bad in BAD:
            key = (path, repr(bad))
            if key in VALID:
                continue
            yield pytest.param(obj, params, bad, id=f"{path}-{bad!r}")


def test_the_surface_is_covered():
    """The generated cases reach the public functions (a broken generator would pass)."""
    paths = {path for path, _, _ in FUNCTIONS}
    assert len(paths) >= 80
    assert {"forgetkit.Run", "forgetkit.load", "forgetkit.accuracy",
            "forgetkit.evaluate.nll", "forgetkit.plots.compare_methods"} <= paths
    assert {p for p, _ in VALID if p.startswith("forgetkit.")} <= paths


@pytest.mark.parametrize("obj, params, bad", list(_cases()))
def test_bad_arguments_raise_forgetkit_errors(obj, params, bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # functions that write get a path here
    _assert_refused(obj, params, bad, obj.__qualname__)


# --------------------------------------------------------- optional arguments
#: Optional arguments that may take anything for these calls: (path, name) -> why.
OPTIONAL_VALID = {
    ("forgetkit.mean_surprisal", "sequence_ids"): "read only with by='sequence'",
}
#: What these calls need beside the run of the tests (a run that is not a token run).
CONTEXT = {
    "forgetkit.to_topk": {"top_k": 2},
    "forgetkit.memorization": {"sequence_ids": np.arange(40) // 10},
    "forgetkit.sequence_dynamics": {"sequence_ids": np.arange(40) // 10},
}


def _optional_cases():
    """Every optional argument of the public functions of a run, with a bad value."""
    for path, obj in public_objects():
        if not inspect.isfunction(obj) or "." in obj.__qualname__:
            continue
        params = list(inspect.signature(obj).parameters.values())
        if not params or params[0].name not in ("run", "test") or _required(obj)[1:]:
            continue
        for p in params[1:]:
            if p.kind == p.VAR_KEYWORD or p.name == "ax" or (path, p.name) in OPTIONAL_VALID \
                    or p.name in CONTEXT.get(path, {}):
                continue
            for bad in ("nope", -3):
                yield pytest.param(path, obj, p, bad, id=f"{path}-{p.name}-{bad!r}")


@pytest.mark.parametrize("path, fn, param, bad", list(_optional_cases()))
def test_optional_arguments_are_checked(path, fn, param, bad, run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call = functools.partial(fn, run, **CONTEXT.get(path, {}))
    _assert_refused(call, [param.replace(kind=param.KEYWORD_ONLY)], bad,
                    f"{path}({param.name}=...)")


# ------------------------------------------------------------------ methods
@pytest.fixture(scope="module")
def run():
    rng = np.random.default_rng(0)
    labels = np.arange(40) % 3
    outputs = rng.normal(size=(4, 40, 3)).astype(np.float32)
    outputs[:, np.arange(40), labels] += np.linspace(0, 3, 4)[:, None]  # learned over time
    return fk.Run(outputs, labels, epochs=[0, 2, 4, 6], sample_ids=np.arange(100, 140))


FUSERS = {
    "KnowledgeFusion": lambda: fk.KnowledgeFusion(),
    "CheckpointAverage": lambda: fk.CheckpointAverage("horizontal", max_checkpoints=2),
    "EarlyStopping": lambda: fk.EarlyStopping(),
    "EnsembleSelection": lambda: fk.EnsembleSelection(max_checkpoints=2),
    "LikelihoodFusion": lambda: fk.LikelihoodFusion(),
}


def _methods(cls, prefix):
    """(name, required parameters) of the public methods of ``cls`` (and its bases listed
    under ``prefix``) in the public surface."""
    out = {}
    for path, obj in public_objects():
        owner, _, name = path.rpartition(".")
        if owner in prefix and inspect.isfunction(obj) and hasattr(cls, name) \
                and name != "fit":
            out[name] = _required(obj, skip_first=True)
    return sorted(out.items())


#: Optional arguments that take data (a position, a selection, a file), tested like the
#: required ones: method -> names.
OPTIONAL = {
    "probs": ["index"], "isel": ["epochs", "samples"], "sel": ["epochs", "samples"],
    "split": ["val_frac"], "save": ["path"],
}


def _method_cases():
    for cls in [fk.Run, fk.report.Explorer, *(getattr(fk, n) for n in FUSERS)]:
        prefixes = {f"forgetkit.{cls.__name__}", "forgetkit.Fuser",
                    f"forgetkit.report.{cls.__name__}"}
        for name, params in _methods(cls, prefixes):
            optional = [p for p in inspect.signature(getattr(cls, name)).parameters.values()
                        if p.name in OPTIONAL.get(name, ()) and p not in params]
            if params or optional:
                for bad in BAD:
                    if (f"{cls.__name__}.{name}", repr(bad)) in VALID:
                        continue
                    yield pytest.param(cls.__name__, name, params + optional, bad,
                                       id=f"{cls.__name__}.{name}-{bad!r}")


def _instance(kind, run, tmp_path):
    if kind == "Run":
        return run
    if kind == "Explorer":
        return fk.explore(run)
    return FUSERS[kind]().fit(run)


@pytest.fixture(scope="module")
def instances(run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("instances")
    return {kind: _instance(kind, run, tmp) for kind in ["Run", "Explorer", *FUSERS]}


@pytest.mark.parametrize("kind, name, params, bad", list(_method_cases()))
def test_methods_refuse_bad_arguments(kind, name, params, bad, instances, tmp_path,
                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    method = getattr(instances[kind], name)
    _assert_refused(method, params, bad, f"{kind}.{name}")


WRITERS = {
    "RunWriter": lambda p, labels: fk.RunWriter(p / "w.npy", 40, 3, labels=labels),
    "SummaryWriter": lambda p, labels: fk.SummaryWriter(p / "s.npy", 40, 3, labels=labels),
}


def _writer_cases():
    for kind in sorted(WRITERS):
        for bad in BAD:
            yield pytest.param(kind, bad, id=f"{kind}-{bad!r}")


@pytest.mark.parametrize("kind, bad", list(_writer_cases()))
def test_writers_refuse_bad_appends(kind, bad, run, tmp_path):
    writer = WRITERS[kind](tmp_path, run.labels)
    try:
        _assert_refused(writer.append, _required(writer.append), bad, f"{kind}.append")
    finally:
        writer.abort()


# ---------------------------------------------------------------------- CLI
def _subcommands():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_subcommand_is_tested():
    assert set(_subcommands()) == set(CLI_BAD) | set(CLI_NO_FILE)


#: Subcommand -> argv of bad values after a bad file (besides the bad file itself).
CLI_BAD = {
    "analyze": [],
    "convert": ["out.npz"],
    "verify": [],
    "datamap": ["--burn-out", "0"],
    "scores": ["--out", "s.csv", "--window", "-3"],
    "coreset": ["--score", "forgetting", "--keep", "5", "--out", "keep.npy"],
    "sequences": ["--out", "s.csv"],
    "fuse": ["--plan", "p.json"],
    "apply": ["RUN", "--out", "p.npy"],
    "compare": ["--seeds", "-1"],
    "sweep": ["--out", "s.csv"],
    "distill": ["RUN", "--out", "t.npy"],
    "report": ["--out", "r.html"],
    "replay": ["--data", "nope.npz", "--out", "r.npy"],
    "compare-weights": ["--model", "nope:f", "--data", "nope.npz", "--run", "RUN"],
}
#: Subcommands without a file argument: argv of bad values.
CLI_NO_FILE = {"warmup": ["--jobs", "nope"]}


def _run_cli(argv, capsys):
    try:
        rc = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        rc = exit_.code
    err = capsys.readouterr().err
    return rc, err


@pytest.fixture
def junk(tmp_path):
    """A file that is no run, plan or table of any format, under each name a command reads."""
    for name in ["junk.npz", "junk.npy", "junk.parquet", "junk.json", "junk.csv"]:
        (tmp_path / name).write_bytes(b"\x93NUMPY junk \x00\xff" * 7)
    return tmp_path


def _cli_file_cases():
    for command in sorted(CLI_BAD):
        # sweep starts a dask cluster for files that exist: one kind of junk is enough
        suffixes = [".npy", "missing"] if command == "sweep" else \
            [".npy", ".npz", ".json", ".csv", "missing"]
        for suffix in suffixes:
            yield pytest.param(command, suffix, id=f"{command}-{suffix}")


@pytest.mark.parametrize("command, suffix", list(_cli_file_cases()))
def test_cli_bad_file_is_one_line(command, suffix, junk, capsys, monkeypatch):
    monkeypatch.chdir(junk)
    bad = "nope.npy" if suffix == "missing" else f"junk{suffix}"
    extra = [bad if a == "RUN" else a for a in CLI_BAD[command]]
    rc, err = _run_cli([command, bad, *extra], capsys)
    _assert_one_line(command, rc, err, bad)


@pytest.mark.parametrize("command", sorted(CLI_NO_FILE))
def test_cli_bad_value_is_one_line(command, capsys):
    rc, err = _run_cli([command, *CLI_NO_FILE[command]], capsys)
    _assert_one_line(command, rc, err)


def _assert_one_line(command, rc, err, bad=None):
    assert "Traceback" not in err, f"{command}: a traceback:\n{err}"
    lines = err.strip().splitlines()
    if rc == 2:  # argparse: the usage, then one line saying the error
        assert lines and lines[-1].startswith("forgetkit"), f"{command}: {err!r}"
        return
    assert rc == 1, f"{command}: exit {rc}: {err!r}"
    # verify reports each run on a line of its own, starting with the run's path
    start = f"{bad}: bad: " if command == "verify" else f"forgetkit {command}: error: "
    assert len(lines) == 1 and lines[0].startswith(start), f"{command}: not one line: {err!r}"


@pytest.fixture(scope="module")
def files(run, tmp_path_factory):
    """A valid run, plan and scores table, for the commands run with bad option values."""
    folder = tmp_path_factory.mktemp("cli")
    fk.save(run, folder / "r.npz")
    fk.KnowledgeFusion().fit(run).to_json(folder / "plan.json")
    assert cli.main(["scores", str(folder / "r.npz"), "--out", str(folder / "s.csv"),
                     "--quiet"]) == 0
    return folder


#: argv of valid files (RUN, PLAN, SCORES) with a bad option value.
CLI_BAD_VALUES = [
    ["analyze", "RUN", "--labels", "nope.npy"],
    ["convert", "RUN", "out.txt"],
    ["datamap", "RUN", "--burn-out", "0"],
    ["datamap", "RUN", "--select", "ambiguous", "--frac", "5", "--out", "ids.csv"],
    ["scores", "RUN", "--out", "s2.csv", "--window", "-3"],
    ["scores", "RUN", "--out", "s2.csv", "--epochs", "99"],
    ["coreset", "SCORES", "--score", "forgetting", "--keep", "5", "--out", "k.npy"],
    ["coreset", "SCORES", "--score", "forgetting", "--keep", "0.5", "--strata", "0",
     "--out", "k.npy"],
    ["sequences", "RUN", "--out", "q.csv"],
    ["fuse", "RUN", "--window", "-1", "--plan", "p2.json"],
    ["fuse", "RUN", "--val-frac", "2", "--plan", "p2.json"],
    ["fuse", "RUN", "--grid", "-4", "--plan", "p2.json"],
    ["apply", "RUN", "RUN", "--out", "f.npy"],
    ["compare", "RUN", "--seeds", "-1"],
    ["compare", "RUN", "--val-frac", "0"],
    ["sweep", "RUN", "--out", "w.csv", "--val-frac", "0"],
    ["distill", "PLAN", "RUN", "--out", "t.npy", "--temperature", "0"],
    ["distill", "PLAN", "RUN", "--out", "t.txt"],
    ["report", "RUN", "--out", "r.html", "--class-names", "a,b"],
    ["report", "RUN", "--out", "r.html", "--window", "-2"],
]


@pytest.mark.parametrize("argv", CLI_BAD_VALUES, ids=" ".join)
def test_cli_bad_value_is_one_line_on_a_valid_run(argv, files, capsys, monkeypatch):
    monkeypatch.chdir(files)
    names = {"RUN": "r.npz", "PLAN": "plan.json", "SCORES": "s.csv"}
    rc, err = _run_cli([names.get(a, a) for a in argv], capsys)
    _assert_one_line(argv[0], rc, err)


def test_class_names_are_text_in_every_figure(run, tmp_path):
    """Class names that read as matplotlib math are shown as written, in every figure."""
    names = ["$\\frac{a$", "b_$x", "$c^$"]
    paths = fk.write_report(run.replace(class_names=names), tmp_path / "figs", fmt="png",
                            seeds=(0,))
    assert paths and all(p.stat().st_size > 0 for p in paths)
    ax = fk.plots.forget_learn([run, run], labels=names[:2])
    assert [t.get_text() for t in ax.get_legend().get_texts()][0].startswith("\\$")


def test_the_cases_issue_38_lists(run, tmp_path):
    """The calls issue 38 found raising TypeError, AttributeError, ValueError, IndexError or
    AxisError (those outside forgetkit.io): each is a ForgetkitError naming the argument."""
    kf = fk.KnowledgeFusion().fit(run)
    cases = [
        (lambda: fk.Run(run.outputs, run.labels, class_names=5), "class_names"),
        (lambda: fk.load_fuser(5), "source"),
        (lambda: fk.load_fuser({}), "source"),
        (lambda: fk.read_soft_targets(5), "path"),
        (lambda: fk.write_report(run, 5), "out"),
        (lambda: fk.write_report("run", tmp_path / "x.html"), "run"),
        (lambda: fk.noise.symmetric("abc", 0.2, 3), "labels"),
        (lambda: fk.mcnemar("a", "b"), "correct_a"),
        (lambda: fk.accuracy([1, 2]), "run"),
        (lambda: fk.average_runs([run, "x"]), "runs[1]"),
        (lambda: fk.multi_run("x"), "runs"),
        (lambda: fk.format_table(5), "table"),
        (lambda: fk.snapshot(run, "a"), "cycle_ends"),
        (lambda: kf.predict("x"), "run"),
        (lambda: fk.split_indices("10", 0.5), "n_samples"),
    ]
    for call, name in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            with pytest.raises(fk.ForgetkitError, match=re.escape(name)):
                call()
