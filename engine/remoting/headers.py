"""Typed reads of a command's custom header (``extFields``: every value travels as a string)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.errors import RemotingProtocolError

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class Header:
    """The custom header of one request.

    Args:
        fields: the request's ``extFields``.
        aliases: short names a compact header uses for the long ones (SEND_MESSAGE_V2's ``a``..``n``).
    """

    def __init__(self, fields: Mapping[str, str], aliases: Mapping[str, str] | None = None) -> None:
        self._fields = dict(fields)
        for short, long in (aliases or {}).items():
            if short in self._fields and long not in self._fields:
                self._fields[long] = self._fields[short]

    def text(self, name: str, default: str | None = None, *, required: bool = True) -> str:
        """A string field.

        Raises:
            RemotingProtocolError: a required field is missing.
        """
        value = self._fields.get(name)
        if value is None:
            if default is not None or not required:
                return default  # type: ignore[return-value]
            raise RemotingProtocolError(f"header field {name!r} is required", field=name)
        return value

    def optional(self, name: str) -> str | None:
        """A string field, None when absent."""
        return self._fields.get(name)

    def _number(self, name: str, default: int | None, bounds: tuple[int, int]) -> int:
        value = self._fields.get(name)
        if value is None or value == "":
            if default is None:
                raise RemotingProtocolError(f"header field {name!r} is required", field=name)
            return default
        try:
            number = int(value)
        except ValueError:
            raise RemotingProtocolError(
                f"header field {name!r} is not an integer: {value!r}", field=name
            ) from None
        if not bounds[0] <= number <= bounds[1]:
            raise RemotingProtocolError(f"header field {name!r} is out of range: {value!r}", field=name)
        return number

    def int32(self, name: str, default: int | None = None) -> int:
        """A Java ``Integer`` field.

        Raises:
            RemotingProtocolError: missing (without a default), not an integer, or out of range.
        """
        return self._number(name, default, _INT32)

    def int64(self, name: str, default: int | None = None) -> int:
        """A Java ``Long`` field.

        Raises:
            RemotingProtocolError: missing (without a default), not an integer, or out of range.
        """
        return self._number(name, default, _INT64)

    def flag(self, name: str, default: bool = False) -> bool:
        """A Java ``boolean`` field (``"true"`` / ``"false"``)."""
        value = self._fields.get(name)
        return default if value is None else value.strip().lower() == "true"


def json_body(body: bytes, what: str) -> Any:
    """A request body holding JSON (fastjson's output: integer map keys may come unquoted).

    Raises:
        RemotingProtocolError: the body is not JSON.
    """
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RemotingProtocolError(f"{what} body is not JSON: {exc}", field="body") from None


def json_bytes(value: Any) -> bytes:
    """A response body as JSON."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
