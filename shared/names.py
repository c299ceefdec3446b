"""Names that become parts of Redis keys: registered datasets, splits and principals.

One documented character set, so that no two names share a key: 1 to 64 characters, letters,
digits, ``_`` and ``-``, starting with a letter or a digit. ``:`` (the key separator), ``/``
(the ``dataset/split`` separator), spaces, braces (hash tags) and ``.`` (kombu's pidbox keys end
``.pidbox``, and the ACL patterns that let workers reach them must match no evalq key) are never
part of a name.
"""

from __future__ import annotations

import re

from shared.errors import InputError

__all__ = ["NAME_RULE", "check_name", "is_name"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

NAME_RULE = "1-64 letters, digits, '_' or '-', starting with a letter or digit"


def is_name(value: str) -> bool:
    """Whether ``value`` follows the name rule."""
    return _NAME.fullmatch(value) is not None


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a valid ``kind`` (``dataset name``, ``split``, ``principal``);
    :class:`InputError` naming the rule otherwise."""
    if not is_name(value):
        raise InputError(f"invalid {kind} {value!r}: use {NAME_RULE}")
    return value
