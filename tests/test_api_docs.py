"""The documented API is the real one: docs/api.md's naming table lists every public function
and class with its real signature, every signature and module path that the README, the
guides in docs/ or the table states is the real one, their Python blocks call real signatures
(test_guides.py runs the blocks; the README's tour runs in test_fuser_api.py), and no
submodule is shadowed by a function of the same name."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re

import pytest

import forgetkit as fk
from forgetkit.evaluate import DEFAULT_METHODS, METHODS
from forgetkit.run import DEFAULT_MEMORY_BUDGET

from .conftest import ROOT

README = ROOT / "README.md"
API = ROOT / "docs" / "api.md"
#: The guides: every page of docs/ but the naming table and the definitions (notation).
GUIDES = sorted(p for p in (ROOT / "docs").glob("*.md")
                if p.name not in ("api.md", "definitions.md"))
#: The pages whose prose and code blocks call the public API.
DOCS = [README, *GUIDES]

#: Namespaces whose ``__all__`` is public API (module path -> how users write it).
PACKAGES = ("forgetkit", "forgetkit.analysis", "forgetkit.fusion", "forgetkit.io",
            "forgetkit.report", "forgetkit.distributed")
#: Modules whose every public top-level function and class is public API, under the path
#: users write.
MODULES = {
    "forgetkit.evaluate": "forgetkit.evaluate",
    "forgetkit.datasets": "forgetkit.datasets",
    "forgetkit.errors": "forgetkit.errors",
    "forgetkit.theory.fairness": "forgetkit.fairness",
    "forgetkit.theory.linear": "forgetkit.linear",
    "forgetkit.theory.noise": "forgetkit.noise",
    "forgetkit.report.plots": "forgetkit.plots",
    "forgetkit.fusion.distill": "forgetkit.distill",
}
#: Defaults shown by name in the table.
NAMED_DEFAULTS = {"memory_budget": ("DEFAULT_MEMORY_BUDGET", DEFAULT_MEMORY_BUDGET),
                  "methods": ("DEFAULT_METHODS", DEFAULT_METHODS),
                  "method_labels": ("METHODS", METHODS)}


# ------------------------------------------------------------------- the surface
def _deprecated(obj):
    return hasattr(obj, "deprecated_alias_of")


def _own_members(cls):
    """Public methods and properties defined by ``cls`` itself (not inherited)."""
    for name, value in vars(cls).items():
        if name.startswith("_") or _deprecated(value):
            continue
        if isinstance(value, (property, classmethod, staticmethod)) or inspect.isfunction(value):
            yield name, value


def public_objects():
    """(path, object) of every public function, class, method and property, each once,
    under the shortest path users write; deprecated aliases left out."""
    seen, out = set(), []

    def add(path, obj):
        if id(obj) in seen or _deprecated(obj):
            return
        seen.add(id(obj))
        out.append((path, obj))
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for name, member in _own_members(obj):
                out.append((f"{path}.{name}", member))

    for package in PACKAGES:
        try:
            mod = importlib.import_module(package)
        except ImportError:  # forgetkit.distributed without dask
            continue
        for name in mod.__all__:
            obj = getattr(mod, name)
            if not inspect.ismodule(obj) and (inspect.isfunction(obj) or inspect.isclass(obj)):
                add(f"{package}.{name}", obj)
    try:  # the lazy attribute of the optional dask extra
        add("forgetkit.sweep", fk.sweep)
    except ImportError:
        pass
    for module, path in MODULES.items():
        mod = importlib.import_module(module)
        for name, obj in vars(mod).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", None) == module:
                add(f"{path}.{name}", obj)
    return out


def resolve(path):
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj,
                                                                                       part)
        return obj
    raise ImportError(path)


def _default(param):
    named = NAMED_DEFAULTS.get(param.name)
    if named is not None and param.default == named[1]:
        return named[0]
    if isinstance(param.default, type):
        return f"np.{param.default.__name__}" if param.default.__module__ == "numpy" \
            else param.default.__name__
    return repr(param.default)


def format_signature(path, obj):
    """How the table writes ``obj``: ``name(params)`` with defaults, ``name`` for a property
    or an exception class."""
    name = path.rsplit(".", 1)[-1]
    if isinstance(obj, property) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
        return name
    func = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
    params = list(inspect.signature(func).parameters.values())
    if not inspect.isclass(obj) and not isinstance(obj, staticmethod) \
            and inspect.isclass(resolve(path.rsplit(".", 1)[0])):
        params = params[1:]  # a method's self or cls
    params = [p for p in params if not p.name.startswith("_")]  # private parameters
    parts, star = [], False
    for p in params:
        if p.kind == p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind == p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
        elif p.kind == p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            parts.append(p.name if p.default is p.empty else f"{p.name}={_default(p)}")
    return f"{name}({', '.join(parts)})"


# ------------------------------------------------------------- docs/api.md's table
ROW = re.compile(r"^\| `(forgetkit[\w.]*)` \| `([^`]+)` \| (.+?) \| (.+?) \|$")


def table_rows():
    rows = [ROW.match(line) for line in API.read_text().splitlines()]
    return [m.groups() for m in rows if m]


def test_table_states_the_real_signatures():
    rows = table_rows()
    assert len(rows) > 100
    wrong = []
    for path, stated, returns, what in rows:
        obj = resolve(path)
        if stated != format_signature(path, obj):
            wrong.append(f"{path}: table {stated!r}, real {format_signature(path, obj)!r}")
        assert returns.strip() and what.strip(), path
    assert not wrong, "\n".join(wrong)


def test_table_lists_every_public_name_once():
    listed = [path for path, *_ in table_rows()]
    assert len(listed) == len(set(listed)), "a name is listed twice"
    missing = [path for path, _ in public_objects() if path not in listed]
    assert not missing, f"public names missing from docs/api.md: {missing}"


# ------------------------------------------------------------------ module paths
def _packages():
    for info in pkgutil.walk_packages(fk.__path__, "forgetkit."):
        if info.ispkg:
            yield info.name


def test_no_submodule_shadowed_by_a_function():
    """Every package's attribute named like one of its submodules is that submodule (after
    importing the submodule, as any user's ``import pkg.sub`` does)."""
    checked = 0
    for name in ["forgetkit", *_packages()]:
        try:
            package = importlib.import_module(name)
        except ImportError:  # forgetkit.distributed without dask
            continue
        for info in pkgutil.iter_modules(package.__path__):
            attr = getattr(package, info.name, None)
            if attr is None:
                continue
            assert inspect.ismodule(attr), f"{name}.{info.name} is {attr!r}, not the submodule"
            assert attr.__name__ == f"{name}.{info.name}"
            checked += 1
    assert checked >= 20
    import forgetkit.analysis.label_issues as li

    assert inspect.ismodule(li) and li.label_issues is fk.label_issues


def test_module_attributes_import_under_their_path():
    for name in dir(fk):
        obj = getattr(fk, name)
        if inspect.ismodule(obj) and obj.__name__.startswith("forgetkit") and name[0] != "_":
            assert importlib.import_module(f"forgetkit.{name}") is obj, name
    from forgetkit.fairness import amplification_bias
    from forgetkit.linear import simulate_deep_linear
    from forgetkit.noise import large_loss_dominance
    from forgetkit.plots import accuracy_retention

    assert amplification_bias.__module__ == "forgetkit.theory.fairness"
    assert simulate_deep_linear and large_loss_dominance and accuracy_retention


MODULE_PATH = re.compile(r"`(forgetkit(?:\.\w+)+)`")
FRAMEWORK = {"torch": "PyTorch", "jax": "JAX", "keras": "Keras", "huggingface": "transformers"}


@pytest.mark.parametrize("doc", [README, API, *GUIDES], ids=lambda p: p.name)
def test_every_module_path_named_imports(doc):
    """Every `forgetkit.x.y` in backticks is a module that imports or an attribute of one."""
    paths = sorted(set(MODULE_PATH.findall(doc.read_text())))
    assert paths or doc in GUIDES
    for path in paths:
        framework = next((FRAMEWORK[k] for k in FRAMEWORK if f"exporters.{k}" in path), None)
        if framework is not None:
            try:
                importlib.import_module(path)
                continue
            except ImportError as err:
                if err.name != path:  # only for want of the framework: the recorder tests
                    assert err.name and not err.name.startswith("forgetkit"), err  # import it
                    continue
        resolve(path)  # a module, or an attribute of one (an exporter's function)


# --------------------------------------------------------- signatures in prose
MENTION = re.compile(r"`((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\(([^`]*)\)`")
#: How a prefix in the docs names a class, for ``run.split(...)``-style mentions.
OWNERS = {"run": fk.Run, "Run": fk.Run, "kf": fk.KnowledgeFusion, "fk": fk, "forgetkit": fk,
          "evaluate": fk.evaluate, "plots": fk.plots, "Fuser": fk.Fuser}


def _index():
    """short name -> objects of the public surface having it."""
    index = {}
    for path, obj in public_objects():
        index.setdefault(path.rsplit(".", 1)[-1], []).append((path, obj))
    return index


def mention_target(name, index):
    """The public object a mention ``a.b.name`` refers to, or None for other libraries'."""
    parts = name.split(".")
    if parts[:2] == ["forgetkit", "exporters"]:
        try:
            importlib.import_module(".".join(parts[:3]))
        except ImportError as err:  # for want of the framework (the recorder tests import it)
            assert err.name and not err.name.startswith("forgetkit"), err
            return None
    if parts[0] == "forgetkit" and len(parts) > 1:
        try:
            return resolve(name)
        except (ImportError, AttributeError):
            pytest.fail(f"`{name}(...)` names no forgetkit object")
    if len(parts) > 1 and parts[-2] in OWNERS:
        owner = OWNERS[parts[-2]]
        obj = inspect.getattr_static(owner, parts[-1], None) if inspect.isclass(owner) \
            else getattr(owner, parts[-1], None)
        assert obj is not None, f"`{name}(...)`: {parts[-2]} has no {parts[-1]}"
        return obj
    found = index.get(parts[-1], [])
    if not found:
        return None
    return found[0][1]


def _callable(obj):
    return obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj


def check_mention(name, args, index, *, strict_names):
    """Bind the mention's arguments to the real signature; with ``strict_names`` (prose
    states a signature) a bare name given positionally must be that parameter's name."""
    return check_call(mention_target(name, index), name, args, strict_names=strict_names)


def check_call(obj, name, args, *, strict_names):
    """`check_mention` of a call ``name(args)`` to the object ``obj`` (None: not ours)."""
    if obj is None or isinstance(obj, property):
        return None
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError:
        return f"`{name}({args})` is not a call in Python syntax"
    if inspect.ismodule(obj):
        return f"`{name}({args})` calls a module"
    sig = inspect.signature(_callable(obj))
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    sig = sig.replace(parameters=params)
    try:
        bound = sig.bind(*[object()] * len(call.args), **{k.arg: object() for k in call.keywords})
    except TypeError as err:
        return f"`{name}({args})` does not fit {name.split('.')[-1]}{sig}: {err}"
    if strict_names:
        names = list(bound.arguments)
        for i, a in enumerate(call.args):
            if isinstance(a, ast.Name) and names[i] != a.id:
                return f"`{name}({args})`: argument {i} is {names[i]!r} in {sig}"
    return None


def prose(text):
    """A page without its fenced code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_prose_signatures_are_real():
    """Every call written in the README's or a guide's text fits the real signature."""
    index = _index()
    errors, checked = [], 0
    for doc in DOCS:
        for name, args in MENTION.findall(prose(doc.read_text())):
            if mention_target(name, index) is None:
                continue
            checked += 1
            error = check_mention(name, args, index, strict_names=True)
            errors.append(error and f"{doc.name}: {error}")
    assert checked >= 40
    assert not [e for e in errors if e], "\n".join(e for e in errors if e)


def code_blocks(text, lang="python"):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def imported(node):
    """{name: object} of a ``from forgetkit... import name`` statement; an exporter whose
    framework is not installed gives None (the recorder tests import it)."""
    if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forgetkit")):
        return {}
    try:
        module = importlib.import_module(node.module)
    except ImportError as err:
        assert err.name and not err.name.startswith("forgetkit"), err
        module = None
    return {a.asname or a.name: module and getattr(module, a.name) for a in node.names}


def code_calls(text):
    """(name, args, target) of each call in a page's Python blocks to ``fk.``, ``forgetkit.``,
    ``run.`` or ``kf.`` names (target ``...``: `mention_target` finds it) or to a name
    imported from forgetkit (target: the imported object, None without its framework), in
    page order (an import binds its names for the rest of the page)."""
    names = {}
    for block in code_blocks(text):
        for statement in ast.parse(block).body:
            names.update(imported(statement))
            for node in ast.walk(statement):
                if not isinstance(node, ast.Call):
                    continue
                name = _dotted(node.func)
                if name is None or any(isinstance(a, ast.Starred) for a in node.args) \
                        or any(k.arg is None for k in node.keywords):
                    continue
                args = ", ".join([ast.unparse(a) for a in node.args]
                                 + [f"{k.arg}={ast.unparse(k.value)}" for k in node.keywords])
                if name in names:
                    yield name, args, names[name]
                elif name.startswith(("fk.", "forgetkit.", "run.", "kf.")):
                    yield name, args, ...


def test_code_calls_fit_the_signatures():
    """Every call of the public API in the README's and the guides' Python blocks (run or
    not) fits the real signature."""
    index = _index()
    errors, checked = [], 0
    for doc in DOCS:
        for name, args, obj in code_calls(doc.read_text()):
            target = mention_target(name, index) if obj is ... else obj
            checked += target is not None
            error = check_call(target, name, args, strict_names=False)
            errors.append(error and f"{doc.name}: {error}")
    assert checked >= 80
    assert not [e for e in errors if e], "\n".join(e for e in errors if e)


# ---------------------------------------------------- the table's own statements
def test_table_mentions_in_prose_are_real():
    """Signatures written in docs/api.md's text (outside the table) are real too."""
    index = _index()
    text = re.sub(r"## Deprecated names.*?\n## ", "", API.read_text(), flags=re.S)  # old forms
    text = "\n".join(line for line in text.splitlines() if not ROW.match(line))
    errors = [check_mention(n, a, index, strict_names=True) for n, a in MENTION.findall(text)
              if mention_target(n, index) is not None]
    assert not [e for e in errors if e], "\n".join(e for e in errors if e)
