"""Typed records' helpers: ``instant`` (the ordering key of naive and offset-carrying timestamps)."""

from datetime import datetime, timedelta, timezone

import pytest

from nemori_dspy.errors import InvalidInputError
from nemori_dspy.types import instant


def test_instant_reads_naive_in_the_given_zone_and_keeps_offsets():
    aware = datetime.fromisoformat("2023-05-24T23:30:00+08:00")
    assert instant(aware) == datetime(2023, 5, 24, 15, 30, tzinfo=timezone.utc)
    assert instant(datetime(2023, 5, 24, 15, 30)) == instant(aware)
    assert instant(datetime(2023, 5, 24, 23, 30), "Asia/Shanghai") == instant(aware)
    assert instant(aware).utcoffset() == timedelta(0)


def test_instant_names_an_unknown_zone():
    with pytest.raises(InvalidInputError, match="naive_timezone"):
        instant(datetime(2023, 5, 24), "Mars/Olympus")
