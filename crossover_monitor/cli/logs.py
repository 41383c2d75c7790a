"""Logging set-up: text lines for a terminal, logfmt or one JSON object per line for a log shipper."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Literal

LogFormat = Literal["text", "logfmt", "json"]

# Attributes every LogRecord has; anything else came in through ``extra=`` and is a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


def _one_line(value: object) -> str:
    """``value`` with its line breaks escaped: a message that carries a client's or a file's text (a kubelet's
    error details, a worker's stderr) must not forge a second log line for journald or a log shipper."""
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _source(record: logging.LogRecord) -> str:
    """Where the line was logged, as Prometheus's own logs say it (``source=file:line``)."""
    return f"{record.filename}:{record.lineno}"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
        extras = " ".join(f"{k}={_one_line(v)}" for k, v in _fields(record).items())
        line = f"{when} {record.levelname:<7} {record.name}: {_one_line(record.getMessage())}"
        if extras:
            line += " " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _level(record: logging.LogRecord) -> str:
    """The level as Prometheus 2's logs and its ``--log.level`` write it: debug, info, warn, error."""
    return "warn" if record.levelno == logging.WARNING else record.levelname.lower()


def _logfmt_value(value: object) -> str:
    """A logfmt value: bare when it can be, else quoted with quotes, backslashes and line breaks escaped."""
    text = str(value)
    if text and not any(c in text for c in ' ="\\\n\r\t'):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


class LogfmtFormatter(logging.Formatter):
    """``time=… level=info source=daemon.py:240 msg="…" logger=crossover_monitor.service.daemon key=value``: the keys
    Prometheus and its exporters log with (``time``, ``level``, ``source``, ``msg``), then the logger and the
    line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        pairs: dict[str, object] = {
            "time": when,
            "level": _level(record),
            "source": _source(record),
            "msg": record.getMessage(),
            "logger": record.name,
            **_fields(record),
        }
        if record.exc_info:
            pairs["exception"] = self.formatException(record.exc_info)
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in pairs.items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {  # Prometheus's keys first, as in its JSON logs
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": _level(record),
            "source": _source(record),
            "msg": record.getMessage(),
            "logger": record.name,
            **_fields(record),
        }
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def configure(log_format: LogFormat, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatters = {"json": JsonFormatter, "logfmt": LogfmtFormatter, "text": TextFormatter}
    handler.setFormatter(formatters[log_format]())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())  # WARN is WARNING to the logging module too
    # APScheduler logs every job start at INFO; our own sweep logs say more.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
