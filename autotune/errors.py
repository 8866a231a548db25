"""The one error hierarchy of autotune.

Every error autotune raises derives from :class:`AutotuneError` and carries a message that says what
went wrong *and* what to do next. The CLI turns these into a single line and an exit code; nothing
else in the package prints tracebacks for them.
"""

from __future__ import annotations

__all__ = [
    "AutotuneError",
    "UsageError",
    "SpaceError",
    "HardwareError",
    "MachineError",
    "BackendError",
    "LaunchError",
    "StudyError",
    "WriteError",
    "NothingToRecommend",
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "EXIT_NOTHING_TO_RECOMMEND",
    "EXIT_INTERRUPTED",
]

#: the process exit codes of the CLI (documented in the README)
EXIT_OK = 0  # done; for search, report and export: a configuration is recommended
EXIT_FAILURE = 1  # autotune could not do its job (storage unusable, GPUs never freed, ...)
EXIT_USAGE = 2  # bad input: a flag, a file, a name
EXIT_NOTHING_TO_RECOMMEND = 3  # the study ended (or holds) no configuration to recommend
EXIT_INTERRUPTED = 130  # stopped by the user (Ctrl-C)


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose.

    Attributes:
        exit_code: the process exit code the CLI uses for this error.
    """

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """The message and the hint as one line."""
        msg = self.message.rstrip(". ")
        return f"{msg}. {self.hint}" if self.hint else f"{msg}."


class UsageError(AutotuneError):
    """Bad input from the user: a flag, a file, a name. Exit code 2."""

    exit_code = 2


class SpaceError(UsageError):
    """A search-space file that cannot be used (bad YAML, unknown knob, wrong type)."""


class HardwareError(UsageError):
    """The GPUs asked for cannot be had (no driver, too few GPUs, unknown GPU type)."""


class MachineError(HardwareError):
    """The machine is not ready to run trials: ``autotune doctor`` found a failure (a torch without
    CUDA on a GPU host, MIG on, another user's memory on the GPUs, a full disk). Exit code 2."""


class BackendError(UsageError):
    """A backend that cannot run here (framework missing, unsupported flag for its version)."""


class LaunchError(BackendError):
    """A trial's command that the system refuses to start (not found, not executable, an argument list
    too long for the kernel: ``E2BIG``). The trial is INVALID; the study goes on."""


class StudyError(AutotuneError):
    """A study that cannot go on (storage unusable, GPUs never freed)."""


class WriteError(StudyError):
    """A file or the storage of a study that cannot be written (disk full, read-only, no permission).

    Exit code 74 (``EX_IOERR``): not the user's input, and not a trial's failure. The study stops with
    every finished trial kept and nothing left running; it resumes once the cause is fixed.
    """

    exit_code = 74

    @classmethod
    def of(cls, path: object, exc: OSError) -> WriteError:
        """The one-line error for ``exc`` raised while writing ``path``."""
        import errno

        code = errno.errorcode.get(exc.errno or 0)
        cause = exc.strerror or str(exc) or exc.__class__.__name__
        return cls(
            f"cannot write {path}: {cause}{f' ({code})' if code else ''}",
            hint="Free space or fix the directory's permissions, then run the same command again to resume",
        )


class NothingToRecommend(AutotuneError):
    """A study with no configuration to recommend (no healthy trial with memory headroom). Exit code 3."""

    exit_code = EXIT_NOTHING_TO_RECOMMEND
