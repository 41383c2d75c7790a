"""Commands, flags and exit codes; wires configuration, sweep and service together."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from crossover_monitor import __version__
from crossover_monitor.cli.logs import configure
from crossover_monitor.cli.nodecheck import DEFAULT_MAX_AGE_S, Check
from crossover_monitor.config.convert import DAY_S, parse_duration
from crossover_monitor.config.loader import load_settings, memory_warnings, with_listen
from crossover_monitor.config.settings import DEFAULT_PORT, Settings
from crossover_monitor.errors import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_START,
    EXIT_WITHHELD,
    PLOT_EXTRA_HINT,
    ConfigError,
    StartupError,
)
from crossover_monitor.memory import memory_limit
from crossover_monitor.model import SweepResult
from crossover_monitor.protocol import Plan
from crossover_monitor.text import brief
from crossover_monitor.view.report import Progress, render_history, render_history_json, render_json, render_table

log = logging.getLogger("crossover_monitor")

NODE_CHECK_MESSAGE_CHARS = 500  # one line: node-problem-detector keeps the start of it


def _shared_options() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (as Prometheus exporters take theirs).

    Their defaults are suppressed so that a command's own parser never overwrites a value given
    before the command's name; ``_parse`` fills in what neither gave.
    """
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument(
        "--log.format",
        "--log-format",
        dest="log_format",
        choices=["logfmt", "json", "text"],
        default=argparse.SUPPRESS,
        help="log lines as logfmt, JSON objects, or text for a terminal (default: text)",
    )
    shared.add_argument(
        "--log.level",
        "--log-level",
        dest="log_level",
        choices=["debug", "info", "warn", "warning", "error"],
        default=argparse.SUPPRESS,
        help="(default: info; warning is warn)",
    )
    return shared


_SHARED_DEFAULTS = {"log_format": "text", "log_level": "info"}


Command = Callable[[str, str], argparse.ArgumentParser]


def _parser() -> argparse.ArgumentParser:
    shared = _shared_options()
    parser = argparse.ArgumentParser(
        prog="crossover-monitor",
        description="Times matrix multiplication on the CPU and every GPU and exports where the GPU starts to win.",
        parents=[shared],
    )
    parser.add_argument("--version", action="version", version=f"crossover-monitor {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_text, parents=[shared])

    _run_command(command)
    once = command("once", "run one sweep, print the results and exit")
    _config_option(once, "YAML configuration (default: the embedded defaults)")
    once.add_argument("--json", action="store_true", help="print JSON instead of tables")
    check = command("check-config", "validate a configuration file and exit")
    check.add_argument("file", metavar="FILE", nargs="?", help="the file (or give it with --config)")
    _config_option(check, "the file, as the other commands take it")
    command("config-schema", "print the configuration's JSON Schema (for editors) and exit")
    federation = command(
        "check-federation", "check what a fleet's global Prometheus federates (its match[] selectors) and exit"
    )
    federation.add_argument("file", metavar="FILE", type=Path, help="the global Prometheus's configuration")
    history = command("history", "print the recent runs from the run history and exit")
    _config_option(history, "the service's configuration (for history.directory)")
    history.add_argument("--directory", metavar="DIR", type=Path, help="the history's directory (overrides the config)")
    history.add_argument("--limit", metavar="N", type=int, default=20, help="how many runs, newest first (default 20)")
    history.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _node_check_command(command)
    _plot_command(command)
    return parser


def _config_option(command: argparse.ArgumentParser, help_text: str) -> None:
    command.add_argument("--config", "--config.file", dest="config", metavar="FILE", help=help_text)


def _run_command(command: Command) -> None:
    run = command("run", "run the service: sweep on a schedule and serve /metrics")
    _config_option(run, "YAML configuration (default: the embedded defaults)")
    run.add_argument(
        "--web.listen-address",
        "--listen",
        dest="listen",
        metavar="[HOST]:PORT",
        help="override server.listen (:PORT listens on every interface)",
    )
    run.add_argument(
        "--web.config.file",
        dest="web_config",
        metavar="FILE",
        type=Path,
        help="TLS and basic auth, in the web config format of Prometheus exporters (docs/http.md)",
    )
    run.add_argument(
        "--web.enable-lifecycle",
        dest="enable_lifecycle",
        action="store_true",
        help="serve POST /-/reload and POST /-/sweep (behind basic auth when the web config sets users)",
    )


def _node_check_command(command: Command) -> None:
    node = command("node-check", "answer as a node-problem-detector plugin from the running service (exit 0/1/2)")
    node.add_argument(
        "--url",
        default=f"http://127.0.0.1:{DEFAULT_PORT}/metrics",
        help="the running service's /metrics; empty: ask only Prometheus (default: %(default)s)",
    )
    node.add_argument(
        "--check",
        choices=[c.value for c in Check],
        default=Check.DEGRADED.value,
        help="degraded: a GPU failed or (with Prometheus) its throughput fell; drift: the crossover moved, "
        "as the alert rules judge it (needs --prometheus.url). Default: %(default)s",
    )
    node.add_argument(
        "--prometheus.url", dest="prometheus_url", metavar="URL", help="ask this Prometheus for the alerts firing"
    )
    node.add_argument(
        "--instance",
        default=os.environ.get("NODE_NAME") or f"{socket.gethostname()}:{DEFAULT_PORT}",
        help="this node's instance label in Prometheus (default: $NODE_NAME, the node's name under Kubernetes; "
        f"else HOSTNAME:{DEFAULT_PORT}, as a static scrape target names it)",
    )
    node.add_argument("--timeout", default="10s", metavar="DURATION", help="per request (default: %(default)s)")
    node.add_argument(
        "--max-age",
        metavar="DURATION",
        help=f"results older than this are stale: unknown (default: {DEFAULT_MAX_AGE_S / 3600:g}h; raise it for "
        "schedules slower than 45m)",
    )


def _plot_command(command: Command) -> None:
    plot = command("plot", "chart the latest sweep, time against size (.svg; .png needs the plot extra)")
    source = plot.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-json", metavar="FILE", type=Path, help="the output of `once --json`")
    source.add_argument(
        "--from-url", metavar="URL", help=f"a running service's metrics, e.g. http://HOST:{DEFAULT_PORT}/metrics"
    )
    chart_help = f"the chart to write: .svg, or .png with matplotlib ({PLOT_EXTRA_HINT})"
    plot.add_argument("output", metavar="OUTPUT", type=Path, help=chart_help)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    for name, default in _SHARED_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    if args.command == "check-config":
        given = [f for f in (args.file, args.config) if f is not None]
        if len(given) != 1:
            parser.error("check-config: give the file once, as FILE or as --config FILE")
        args.file = args.config = given[0]
    return args


def _settings(args: argparse.Namespace, *, reloading: bool = False) -> Settings:
    settings = load_settings(getattr(args, "config", None), empty_ok=not reloading)
    if getattr(args, "listen", None) is not None:  # an empty --listen is an error, not the default
        settings = with_listen(settings, args.listen)
    # Said at every load (start, reload, check-config, once): the host, not the file, may be what is too small; and
    # a key of an earlier release, which still works, should be rewritten.
    for problem in (*settings.replaced, *memory_warnings(settings, memory_limit())):
        log.warning("configuration warning", extra={"source": settings.source, "problem": str(problem)})
    return settings


def _run(settings: Settings, args: argparse.Namespace) -> int:
    from crossover_monitor.service.daemon import Service  # noqa: PLC0415 - only `run` needs the scheduler and server

    # SIGHUP rereads what started it: the same file, with the same --listen.
    service = Service(
        settings,
        load=lambda: _settings(args, reloading=True),
        web_config=args.web_config,
        enable_lifecycle=args.enable_lifecycle,
    )
    return service.run()


def _once(settings: Settings, as_json: bool) -> int:
    from crossover_monitor.service.sweep import run_sweep  # noqa: PLC0415 - keeps check-config light

    bench = settings.benchmark
    cancel = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: cancel.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    plan = Plan(bench=bench, guard=settings.guard)
    # Progress only for a person at a terminal: nothing extra when stderr is piped or with --json.
    progress = Progress(plan, sys.stderr) if sys.stderr.isatty() and not as_json else None
    try:
        outcome = run_sweep(plan, timeout_s=bench.timeout_s, cancel=cancel, on_message=progress)
    finally:
        if progress is not None:
            progress.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if cancel.is_set():
        print("crossover-monitor: interrupted; the sweep's worker was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(render_json(outcome) if as_json else render_table(outcome))
    if outcome.result is SweepResult.SUCCESS:
        return EXIT_OK
    return EXIT_WITHHELD if outcome.result.completed else EXIT_FAILURE


def _node_check(args: argparse.Namespace) -> int:
    from crossover_monitor.cli.nodecheck import Request, Status, run  # noqa: PLC0415 - only this command needs it

    durations = {}
    for flag, value in (("--timeout", args.timeout), ("--max-age", args.max_age)):
        seconds = None if value is None else parse_duration(value)
        if value is not None and (seconds is None or not 0 < seconds <= DAY_S):
            print(f"unknown: {flag} must be a duration from 1ms to 1d such as 10s or 2h, got {value!r}")
            return int(Status.UNKNOWN)
        durations[flag] = seconds
    request = Request(
        url=args.url,
        check=Check(args.check),
        prometheus_url=args.prometheus_url,
        instance=args.instance,
        timeout_s=durations["--timeout"] or 10.0,
        max_age_s=durations["--max-age"],
    )
    try:
        verdict = run(request, now=time.time())
    except Exception as exc:  # noqa: BLE001 - exit 1 would set the condition: a bug of ours is "unknown"
        print(f"unknown: node-check failed: {type(exc).__name__}: {exc}")
        return int(Status.UNKNOWN)
    # node-problem-detector takes the first line of standard output as the condition's message.
    print(brief(" ".join(verdict.message.split()), NODE_CHECK_MESSAGE_CHARS))
    return int(verdict.status)


def _plot(args: argparse.Namespace) -> int:
    from crossover_monitor.view.chart import PlotError  # noqa: PLC0415 - only this command draws charts
    from crossover_monitor.view.plot import plot  # noqa: PLC0415 - only this command draws charts

    try:
        written = plot(args.output, json_file=args.from_json, url=args.from_url)
    except PlotError as exc:
        print(f"crossover-monitor: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"wrote {written}")
    return EXIT_OK


def _history(settings: Settings, args: argparse.Namespace) -> int:
    from crossover_monitor.service.history import HistoryUnavailable, read_recent  # noqa: PLC0415 - only this command reads it

    directory = args.directory or settings.history.resolved_directory(os.environ)
    if directory is None:
        print(
            "crossover-monitor: no history directory: pass --directory, or --config with history.directory set",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.limit < 1:
        print(f"crossover-monitor: --limit must be at least 1, got {args.limit}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        runs = read_recent(Path(directory), args.limit)
    except HistoryUnavailable as exc:
        print(f"crossover-monitor: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(render_history_json(runs) if args.json else render_history(runs))
    return EXIT_OK


def _config_schema() -> int:
    from crossover_monitor.config.schema import render  # noqa: PLC0415 - only this command needs it

    sys.stdout.write(render())
    return EXIT_OK


def _check_federation(path: Path) -> int:
    """Each federation job's match[] against what the global tier is for: exit 78 where one would bring the per-point
    curve (or everything) to it."""
    from crossover_monitor.cli.federation import YamlFileError, check_file  # noqa: PLC0415 - only this command needs it

    try:
        found, jobs = check_file(path)
    except YamlFileError as exc:
        print(f"crossover-monitor: {path}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for finding in found:
        where = f"job {finding.job}" + (f", match[] {finding.selector}" if finding.selector else "")
        kind = "error" if finding.error else "warning"
        print(f"{path}: {kind}: {where}: {finding.message}", file=sys.stderr)
    if any(finding.error for finding in found):
        return EXIT_CONFIG
    if not jobs:
        print(f"{path}: federates nothing (no job with metrics_path: /federate)")
    elif not found:
        print(f"{path}: federates only what the fleet tier reads")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    configure(args.log_format, args.log_level)
    # Commands with no configuration of their own (node-check is a client of the running service).
    standalone: dict[str, Callable[[], int]] = {
        "config-schema": _config_schema,
        "check-federation": lambda: _check_federation(args.file),
        "node-check": lambda: _node_check(args),
    }
    if args.command in standalone:
        return standalone[args.command]()
    try:
        settings = _settings(args)
        if args.command == "check-config":
            print(f"{args.file}: configuration is valid")
            return EXIT_OK
        commands = {
            "once": lambda: _once(settings, args.json),
            "plot": lambda: _plot(args),
            "history": lambda: _history(settings, args),
        }
        return commands.get(args.command, lambda: _run(settings, args))()
    except ConfigError as exc:
        print(f"crossover-monitor: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StartupError as exc:
        print(f"crossover-monitor: {exc}", file=sys.stderr)
        return EXIT_START
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
