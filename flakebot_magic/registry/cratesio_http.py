"""Polite HTTP to crates.io: the User-Agent, request spacing, retries honouring ``Retry-After``, clear errors."""

from __future__ import annotations

import contextlib
import email.utils
import importlib.metadata
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

import httpx

from ..errors import RegistryError
from ..host.fsutil import load_json

__all__ = [
    "MAX_RETRY_AFTER",
    "OFFLINE_HINT",
    "PoliteClient",
    "RateLimiter",
    "describe",
    "retry_after_seconds",
    "user_agent",
]

#: the longest ``Retry-After`` (seconds) that is waited out; a longer one fails at once
MAX_RETRY_AFTER = 60.0
#: the longest wait between retries when the server does not say how long
_MAX_BACKOFF = 30.0
_PROJECT_URL = "https://github.com/flakebot/flakebot-magic"
#: what to do when crates.io cannot be read
OFFLINE_HINT = "Try again later, or search an offline directory registry instead with --registry PATH."


def user_agent() -> str:
    """The User-Agent flakebot sends, as crates.io's crawler policy asks.

    Examples
    --------
    >>> user_agent().startswith("flakebot-magic/")
    True
    """
    try:
        version = importlib.metadata.version("flakebot-magic")
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"
    return f"flakebot-magic/{version} ({_PROJECT_URL})"


class RateLimiter:
    """Spaces the starts of calls at least ``min_interval`` apart, across threads."""

    def __init__(
        self,
        min_interval: float,
        *,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self._min_interval = max(0.0, min_interval)
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self._next_start: float | None = None

    def wait(self) -> None:
        # The lock is held while sleeping on purpose: waiting callers queue up
        # and each takes the next free slot.
        with self._lock:
            now = self._clock()
            start = now if self._next_start is None else max(now, self._next_start)
            if start > now:
                self._sleep(start - now)
            self._next_start = start + self._min_interval


def retry_after_seconds(response: httpx.Response) -> float | None:
    """Seconds the server asks us to wait, from ``Retry-After`` (seconds or HTTP date)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    # Measure against the server's own clock when it sent one: skew-proof.
    now = datetime.now(timezone.utc)
    date_header = response.headers.get("date")
    if date_header:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            now = email.utils.parsedate_to_datetime(date_header)
            if now.tzinfo is None:
                now = now.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def describe(response: httpx.Response) -> str:
    text = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    detail = error_detail(response)
    return f"{text}: {detail}" if detail else text


def error_detail(response: httpx.Response) -> str:
    """crates.io's ``{"errors": [{"detail": ...}]}`` text, if any."""
    try:
        data = load_json(response.content)
    except ValueError:
        return ""
    if isinstance(data, dict) and isinstance(data.get("errors"), list):
        details = [str(err.get("detail", "")) for err in data["errors"] if isinstance(err, dict)]
        return "; ".join(d for d in details if d)
    return ""


class PoliteClient:
    """GET requests to crates.io as its crawler policy asks.

    Every request carries ``user_agent`` and a timeout, request starts are
    spaced at least ``min_interval`` seconds apart (across threads), and 429,
    5xx answers and transport errors are retried up to ``retries`` times,
    honouring ``Retry-After`` up to :data:`MAX_RETRY_AFTER` seconds.
    """

    def __init__(
        self,
        client: httpx.Client,
        *,
        user_agent: str,
        min_interval: float,
        retries: int,
        timeout: float,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.user_agent = user_agent
        self.retries = max(0, retries)
        self.timeout = timeout
        self._sleep = sleep
        self._limiter = RateLimiter(min_interval, sleep=sleep, clock=clock)

    def get_json(self, url: str, *, what: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        """The JSON object at ``url``, or None on 404."""
        response = self.get(url, what=what, params=params)
        if response.status_code == 404:
            return None
        self.raise_for_status(response, what)
        try:
            data = load_json(response.content)
        except ValueError as exc:
            raise RegistryError(
                f"could not {what}: {url} answered with something that is not JSON. {OFFLINE_HINT}"
            ) from exc
        if not isinstance(data, dict):
            raise RegistryError(f"could not {what}: {url} answered with JSON that is not an object.")
        return data

    def raise_for_status(self, response: httpx.Response, what: str) -> None:
        """Raise :class:`RegistryError` saying what failed (and what to do) unless ``response`` succeeded."""
        if response.is_success:
            return
        hint = (
            " crates.io refuses clients it cannot identify; check the User-Agent."
            if response.status_code == 403
            else f" {OFFLINE_HINT}"
        )
        raise RegistryError(f"could not {what}: {response.request.url} answered {describe(response)}.{hint}")

    def get(
        self,
        url: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        follow_redirects: bool = False,
    ) -> httpx.Response:
        """GET ``url`` politely, retrying 429, 5xx and transport errors."""
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            self._limiter.wait()
            try:
                response = self.client.get(
                    url,
                    params=params,
                    headers={"User-Agent": self.user_agent, "Accept": "application/json"},
                    timeout=self.timeout,
                    follow_redirects=follow_redirects,
                )
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                delay = self._backoff(attempt)
            else:
                if response.status_code != 429 and response.status_code < 500:
                    return response
                last = describe(response)
                asked = retry_after_seconds(response)
                if asked is not None and asked > MAX_RETRY_AFTER:
                    raise RegistryError(
                        f"could not {what}: {url} answered {last} and asked us to wait "
                        f"{asked:.0f} s before trying again, longer than flakebot "
                        f"waits ({MAX_RETRY_AFTER:.0f} s). {OFFLINE_HINT}"
                    )
                delay = asked if asked is not None else self._backoff(attempt)
            if attempt + 1 < attempts:
                self._sleep(delay)
        raise RegistryError(
            f"could not {what}: {url} failed {attempts} time(s), last with {last}. "
            f"crates.io may be down, unreachable from here, or rate-limiting this "
            f"machine. {OFFLINE_HINT}"
        )

    @staticmethod
    def _backoff(attempt: int) -> float:
        return float(min(_MAX_BACKOFF, 2.0**attempt))
