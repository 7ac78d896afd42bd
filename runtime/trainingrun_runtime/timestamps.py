"""RFC 3339 timestamps, the one way both sides write and read them: UTC with a `Z`.

    rfc3339(t)                        2025-01-02T03:04:05.678Z   (manifests, status.runtime, deadlines)
    rfc3339(t, timespec="seconds")    2025-01-02T03:04:05Z       (as the API server writes conditions)
    parse("2025-01-02T03:04:05Z")     an aware datetime in UTC

Shared by the operator (status times, `nextAttemptTime`), the driver (checkpoint manifests, its reports,
the run directory's owner file) and the test bed. Standard library only.
"""

from __future__ import annotations

import datetime
from typing import Literal

__all__ = ["now", "parse", "rfc3339"]


def rfc3339(when: datetime.datetime, *, timespec: Literal["seconds", "milliseconds"] = "milliseconds") -> str:
    """`when` in UTC as RFC 3339 with a `Z`, to the second or the millisecond."""
    return when.astimezone(datetime.UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def now(*, timespec: Literal["seconds", "milliseconds"] = "milliseconds") -> str:
    """The current time as `rfc3339` writes it."""
    return rfc3339(datetime.datetime.now(datetime.UTC), timespec=timespec)


def parse(text: str) -> datetime.datetime:
    """An RFC 3339 time (`Z` or an offset) as an aware datetime in UTC; ValueError naming the text otherwise."""
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (expected a Z or an offset)")
    return when.astimezone(datetime.UTC)
