"""The errors a user's input, files or options cause: one hierarchy under `ForgetkitError`.

Every error forgetkit raises about something the user gave it (an argument, a file, a plan,
a locked run) is a `ForgetkitError`, a ValueError; the command line turns each into one
line on stderr. Any other exception is a bug in forgetkit.
"""

from __future__ import annotations


class ForgetkitError(ValueError):
    """An input, file or option that forgetkit refuses; the message says what and why."""


class InputTypeError(ForgetkitError, TypeError):
    """An argument of the wrong type (also a TypeError)."""


class CorruptFileError(ForgetkitError):
    """A file that is truncated, corrupt, or whose contents or metadata are inconsistent."""


class PlanError(ForgetkitError):
    """A fuser file (plan) that is not valid JSON or does not follow the fuser schema."""


class RunLockedError(ForgetkitError):
    """Another writer holds the run's lock."""


class OverwriteError(ForgetkitError):
    """A destination that is (or resolves to) one of the inputs or their sidecars."""


# The OSError base comes first: OSError builds its instances itself, and exceptions
# rebuilt from a pickle (dask, multiprocessing, tblib) are created through the first base.
class MissingFileError(FileNotFoundError, ForgetkitError):
    """An input file that does not exist (also a FileNotFoundError)."""


class RunExistsError(FileExistsError, ForgetkitError):
    """A run exists where the caller asked for a new one (also a FileExistsError)."""
