"""A running service read over HTTP: its /metrics for ``plot --from-url`` and ``node-check``; Prometheus's API."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from monitor.codec import parse_json
from monitor.errors import MonitorError
from monitor.metrics import parse_exposition

Sample = tuple[str, dict[str, str], float]


class ScrapeError(MonitorError):
    """The URL did not answer, or not with what was asked for; the message says which."""


def fetch_text(url: str, timeout_s: float, *, what: str = "--url") -> str:
    """The body of a GET of an http(s) URL as text."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ScrapeError(f"{what} needs an http(s):// URL such as http://localhost:9437/metrics, got {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - scheme checked above
            return str(response.read().decode("utf-8"))
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
