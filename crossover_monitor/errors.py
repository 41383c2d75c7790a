"""The exception hierarchy; each error renders its own sentence a user can act on."""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILURE = 1  # a sweep run by `once` failed, or the service failed at run time
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h: the configuration is invalid (2, bad usage, is argparse's own)
EXIT_START = 3  # the service could not start (e.g. its listen address is taken)
EXIT_WITHHELD = 4  # `once`: the guard withheld some device (or every one): the output names each and why
EXIT_INTERRUPTED = 130  # `once` was stopped by SIGINT or SIGTERM (128 + SIGINT, the shell's convention)

# What to run where `plot` is asked for a PNG and matplotlib is missing (an SVG needs nothing more).
PLOT_EXTRA_HINT = "pip install 'crossover-monitor[plot]'"


class MonitorError(Exception):
    """Base class: every error the tool raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the configuration, located by its key path."""

    path: str  # e.g. "benchmark.sizes[2]"
    message: str  # e.g. "must be a positive integer, got -5"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(MonitorError):
    """The configuration is invalid; carries every problem found, not just the first.

    Its message lists the first ``SHOWN_PROBLEMS`` and says how many more there are: a file with
    50,000 unknown keys printed 50,001 lines (4.2 MB) to the terminal and the log.
    """

    SHOWN_PROBLEMS = 50

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        shown = [f"  {p}" for p in self.problems[: self.SHOWN_PROBLEMS]]
        count = len(self.problems)
        if count > self.SHOWN_PROBLEMS:
            shown.append(f"  ... and {count - self.SHOWN_PROBLEMS} more: fix these and check again")
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"invalid configuration {source} ({count} {noun}):\n" + "\n".join(shown))


class StartupError(MonitorError):
    """The service cannot start for a reason outside the configuration file."""


class BackendError(MonitorError):
    """A backend could not time something; ``fatal`` marks what retrying cannot fix."""

    fatal = False


class BackendUnavailable(BackendError):
    """The framework behind a backend cannot be imported or initialised."""

    fatal = True

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"backend {backend!r} is unavailable: {reason}")


class DeviceUnavailable(BackendError):
    """A configured device does not exist or cannot be used."""

    def __init__(self, device: str, reason: str, *, fatal: bool = False) -> None:
        self.device = device
        self.reason = reason
        self.fatal = fatal
        super().__init__(f"device {device} is unavailable: {reason}")


class PlacementError(BackendError):
    """A result was computed somewhere other than the device being timed."""

    fatal = True

    def __init__(self, device: str, actual: str) -> None:
        self.device = device
        self.actual = actual
        super().__init__(f"refusing to report a timing for {device}: the result was placed on {actual}")


class MeasurementFailed(BackendError):
    """One point (device, size, dtype, mode) could not be timed, e.g. out of memory."""

    def __init__(self, device: str, what: str, reason: str) -> None:
        self.device = device
        super().__init__(f"timing {what} on {device} failed: {reason}")
