from __future__ import annotations

import datetime

import pytest

from trainingrun_runtime import timestamps

UTC = datetime.UTC


def test_a_time_is_written_in_utc_with_a_z_to_the_millisecond_or_the_second() -> None:
    when = datetime.datetime(2025, 1, 2, 4, 4, 5, 678_900, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    assert timestamps.rfc3339(when) == "2025-01-02T03:04:05.678Z"
    assert timestamps.rfc3339(when, timespec="seconds") == "2025-01-02T03:04:05Z"


def test_what_is_written_parses_back_to_the_same_instant() -> None:
    when = datetime.datetime(2025, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    assert timestamps.parse(timestamps.rfc3339(when)) == when
    assert timestamps.parse("2025-01-02T04:04:05+01:00") == datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize("text", ["yesterday", "2025-01-02T03:04:05", ""])
def test_a_time_without_a_zone_or_not_a_time_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match=r"RFC 3339|time zone"):
        timestamps.parse(text)


def test_now_is_utc_and_recent() -> None:
    before = datetime.datetime.now(UTC) - datetime.timedelta(seconds=1)
    assert timestamps.parse(timestamps.now()) >= before
    assert timestamps.now().endswith("Z")
