"""Names that become parts of Redis keys: registered datasets, splits, principals and run ids.

One documented character set, so that no two names share a key: 1 to 64 characters, letters,
digits, ``_`` and ``-``, starting with a letter or a digit. ``:`` (the key separator), ``/``
(the ``dataset/split`` separator), spaces, braces (hash tags) and ``.`` (kombu's pidbox keys end
``.pidbox``, and the ACL patterns that let workers reach them must match no evalq key) are never
part of a name. A run id is 1 to 64 lowercase hex digits (:data:`RUN_ID`).
"""

from __future__ import annotations

import re

from evalq.shared.errors import InputError, UnknownRunError

__all__ = ["NAME_RULE", "PLUGIN_NAME", "RUN_ID", "check_name", "check_run_id", "is_name"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

NAME_RULE = "1-64 letters, digits, '_' or '-', starting with a letter or digit"

PLUGIN_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,127}$")
"""What an evaluation's or a scorer's registered name may be (lower case; ``.`` allowed)."""

RUN_ID = r"^[0-9a-f]{1,64}$"
"""What a run id is (submit makes 16 hex digits)."""
_RUN_ID = re.compile(RUN_ID)


def is_name(value: str) -> bool:
    """Whether ``value`` follows the name rule."""
    return _NAME.fullmatch(value) is not None


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a valid ``kind`` (``dataset name``, ``split``, ``principal``);
    :class:`InputError` naming the rule otherwise."""
    if not is_name(value):
        raise InputError(f"invalid {kind} {value!r}: use {NAME_RULE}")
    return value


def check_run_id(value: str) -> str:
    """``value`` if it can be a run id; else :class:`UnknownRunError` (``no run 'X'``, exit 2):
    no run has that id, whatever its shape."""
    if _RUN_ID.fullmatch(value) is None:
        raise UnknownRunError.named(value)
    return value
