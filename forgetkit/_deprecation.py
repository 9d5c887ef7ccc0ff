"""Old names and call forms of the public API, kept working with a FutureWarning.

docs/api.md lists every public name; where one changed, the old one goes through here:

- `keyword_options`: a function whose options became keyword-only (and, optionally, whose
  arguments were renamed) still accepts the old positional options and old names, warning
  once per call (scikit-learn's ``_deprecate_positional_args``);
- `renamed`: a deprecated alias of a renamed function;
- `callable_module`: a submodule that a function of the same name used to shadow, still
  callable as that function.
"""

from __future__ import annotations

import functools
import inspect
import types
import warnings


def warn(message, *, stacklevel=3):
    """A FutureWarning pointing at the caller of the deprecated form."""
    warnings.warn(message, FutureWarning, stacklevel=stacklevel)


def keyword_options(func=None, *, renamed=None):
    """Decorate ``func``, whose options are keyword-only, so that calls of the old form still
    work with a FutureWarning: positional values beyond its positional parameters go, in
    order, to its keyword-only parameters (list them in the old positional order), and each
    old argument name in ``renamed`` ({old: new}) goes to the new one."""
    if func is None:
        return functools.partial(keyword_options, renamed=renamed)
    renamed = dict(renamed or {})
    params = inspect.signature(func).parameters.values()
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    name = func.__qualname__.replace(".__init__", "")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        extra = len(args) - len(positional)
        if 0 < extra <= len(keyword):
            moved = dict(zip(keyword, args[len(positional):], strict=False))
            warn(f"{name}(): pass {', '.join(moved)} by keyword "
                 f"({', '.join(f'{k}=...' for k in moved)}); positional options are "
                 "deprecated and will be refused")
            clash = set(moved) & set(kwargs)
            if clash:
                raise TypeError(f"{name}() got multiple values for {sorted(clash)}")
            kwargs.update(moved)
            args = args[:len(positional)]
        for old, new in renamed.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{name}() got both {old!r} (deprecated) and {new!r}")
                warn(f"{name}(): the argument {old!r} is now {new!r}; {old!r} is deprecated")
                kwargs[new] = kwargs.pop(old)
        return func(*args, **kwargs)

    return wrapper


def renamed(func, old, *, where):
    """A deprecated alias ``old`` of ``func`` (``where``: the module path users write)."""
    @functools.wraps(func)
    def alias(*args, **kwargs):
        warn(f"{where}.{old} is deprecated; use {where}.{func.__name__}")
        return func(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old
    alias.deprecated_alias_of = func
    alias.__doc__ = f"Deprecated alias of `{func.__name__}` (FutureWarning)."
    return alias


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        func = self.__dict__["_deprecated_call"]
        warn(f"{self.__name__} is a module: calling it is deprecated; call "
             f"forgetkit.{func.__name__}(...) or {self.__name__}.{func.__name__}(...)")
        return func(*args, **kwargs)


def callable_module(module, func):
    """Let ``module`` (which a function ``func`` of its name used to shadow in its package)
    be called as ``func`` with a FutureWarning; returns the module."""
    module._deprecated_call = func
    module.__class__ = _CallableModule
    return module
