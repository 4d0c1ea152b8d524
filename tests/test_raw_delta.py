"""The raw delta-rs helper reads again past a listing gap and nothing else."""

from __future__ import annotations

import pytest

from tests.raw_delta import through_gaps

GAP = "Generic delta kernel error: Expected contiguous commit files, but found gap"


def test_a_listing_gap_is_read_again_until_the_log_is_whole() -> None:
    calls: list[int] = []

    def read() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError(GAP)
        return "whole"

    assert through_gaps(read) == "whole"
    assert len(calls) == 3


def test_any_other_error_is_raised_at_once() -> None:
    calls: list[int] = []

    def read() -> str:
        calls.append(1)
        raise OSError("No such file or directory")

    with pytest.raises(OSError, match="No such file"):
        through_gaps(read)
    assert len(calls) == 1
