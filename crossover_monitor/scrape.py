"""A running service read over HTTP: its /metrics for ``plot --from-url`` and ``node-check``; Prometheus's API."""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from crossover_monitor.codec import parse_json
from crossover_monitor.errors import MonitorError
from crossover_monitor.metrics import parse_exposition

Sample = tuple[str, dict[str, str], float]


class ScrapeError(MonitorError):
    """The URL did not answer, or not with what was asked for; the message says which."""


# The most of an answer read: a node's /metrics is tens of KiB and Prometheus's answer for one node's alerts
# a few; a server that sends more (a misconfigured proxy, a hostile one) is refused, not held in memory.
MAX_BODY_BYTES = 16 << 20
_CHUNK = 1 << 16


def fetch_text(url: str, timeout_s: float, *, what: str = "--url", max_bytes: int = MAX_BODY_BYTES) -> str:
    """The body of a GET of an http(s) URL as text, whole within ``timeout_s`` (connection, redirects, headers
    and body together: a server that drips its answer a byte at a time would pass every per-read timeout)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ScrapeError(f"{what} needs an http(s):// URL such as http://localhost:9437/metrics, got {url!r}")
    outcome: list[str | BaseException] = []

    def fetch() -> None:
        try:
            outcome.append(_get(url, timeout_s, max_bytes))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            outcome.append(exc)

    # A daemon thread: one the deadline leaves behind ends with the command, which is about to exit.
    fetcher = threading.Thread(target=fetch, name="fetch", daemon=True)
    fetcher.start()
    fetcher.join(timeout_s)
    if not outcome:
        raise ScrapeError(f"cannot fetch {url}: too slow: no whole answer within {timeout_s:.3g}s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _get(url: str, timeout_s: float, max_bytes: int) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - scheme checked above
            body = bytearray()
            while chunk := response.read1(_CHUNK):
                body += chunk
                if len(body) > max_bytes:
                    raise ScrapeError(f"cannot fetch {url}: too large: more than {max_bytes >> 20} MiB")
            return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError(f"{url} did not answer with text: the body is not UTF-8") from None
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"cannot fetch {url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ScrapeError(f"cannot fetch {url}: {reason}") from None
    except (http.client.HTTPException, ValueError) as exc:  # e.g. a bad port in the URL, a non-HTTP answer
        raise ScrapeError(f"cannot fetch {url}: {type(exc).__name__}: {exc}") from None


def fetch_samples(url: str, timeout_s: float, *, what: str = "--url") -> list[Sample]:
    """Every sample a /metrics URL serves, as (name, labels, value)."""
    text = fetch_text(url, timeout_s, what=what)
    try:
        return parse_exposition(text)
    except ValueError as exc:
        raise ScrapeError(f"{url} did not answer with Prometheus metrics: {exc}") from None


def prometheus_query(base_url: str, expr: str, timeout_s: float) -> list[dict[str, Any]]:
    """The result of an instant query against a Prometheus server's HTTP API (a vector's samples)."""
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
        raise ScrapeError(f"--prometheus.url needs an http(s):// URL such as http://prometheus:9090, got {base_url!r}")
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    text = fetch_text(url, timeout_s, what="--prometheus.url")
    try:
        body = parse_json(text)
        if body["status"] != "success":
            raise ScrapeError(f"Prometheus at {base_url} refused the query: {body.get('error', body)}")
        return list(body["data"]["result"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ScrapeError(f"{base_url} did not answer as Prometheus's HTTP API does: {exc!r}") from None
