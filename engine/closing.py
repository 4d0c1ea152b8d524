"""The context-manager protocol every client shares: leaving ``with`` closes it."""

from __future__ import annotations

from typing import Self


class Closing:
    """``with client:`` returns the client and closes it on the way out, error or not."""

    def close(self) -> None:
        """Release what the client holds (flush, stop its threads); safe to call twice."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
