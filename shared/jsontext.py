"""The JSON text every stored value is: compact, strict (no NaN or infinity), written and read by
orjson where it gives what the standard library's strict ``json`` gives, and by the standard
library otherwise. The text is only ever compared with this module's own (a value encodes to one
text); spec fingerprints are the standard library's sorted-key JSON, not this
(:mod:`evalq.shared.data.spec`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import orjson

__all__ = ["from_json", "to_json"]

_STDLIB = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""The standard library's strict encoder: what :func:`to_json` falls back on, and the text (and
the errors) it gives for every value orjson does not take as the standard library would."""
_SCALAR = frozenset({str, int, bool, type(None)})
_KEYS = frozenset({str, int, bool, type(None)})
"""Dict keys both encoders write the same way (``1`` as ``"1"``, ``None`` as ``"null"``); a
float key is not one (orjson writes ``1e-05`` as ``"0.00001"``)."""
_HUGE = float(2**63)
"""A float at least this large may be an integer orjson read beyond 64 bits (it reads those as
floats, losing digits); the standard library reads the text again exactly."""
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS


def _plain(value: Any) -> bool:
    """Whether orjson writes ``value`` as the standard library's strict encoder would (the same
    JSON value): it holds only exact JSON types (no subclass, and nothing orjson writes that the
    standard library refuses: a dataclass, UUID, enum, date), finite floats (orjson writes NaN
    as ``null``) and dict keys of :data:`_KEYS`."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(type(key) in _KEYS for key in value) and _all_plain(value.values())
    if kind is list or kind is tuple:
        return _all_plain(value)
    return kind in _SCALAR


def _all_plain(items: Iterable[Any]) -> bool:
    """:func:`_plain` of each of a container's ``items``, scalars checked inline (a call per
    nested container only)."""
    for item in items:
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in _SCALAR and not _plain(item):
            return False
    return True


def to_json(value: Any) -> str:
    """Compact, strict JSON: how every stored value is encoded. orjson writes a :func:`_plain`
    value (non-ASCII as UTF-8); any other value, and one orjson refuses (an integer beyond 64
    bits, a lone surrogate, nesting deeper than 254), gets the standard library's text and
    errors (``ValueError`` for NaN or infinity, ``TypeError`` for what JSON cannot hold). The
    text is only ever compared with this function's own (a value encodes to one text)."""
    if _plain(value):
        try:
            return orjson.dumps(value, option=_ORJSON_OPTIONS).decode()
        except orjson.JSONEncodeError:
            pass
    return _STDLIB.encode(value)


def _exact(value: Any) -> bool:
    """Whether orjson's reading of a text, ``value``, holds no float of :data:`_HUGE` or more
    (which may be an integer it read inexactly)."""
    items = value.values() if type(value) is dict else value
    for item in items:
        kind = type(item)
        if kind is float:
            if not -_HUGE < item < _HUGE:
                return False
        elif (kind is dict or kind is list) and not _exact(item):
            return False
    return True


def from_json(text: str) -> Any:
    """``json.loads(text)``, read by orjson where it reads the same value (any text it refuses,
    or whose reading may hold an integer beyond 64 bits, is read by ``json.loads``, which
    answers or raises as it does)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    kind = type(value)
    if kind is float:
        return value if -_HUGE < value < _HUGE else json.loads(text)
    if (kind is not dict and kind is not list) or _exact(value):
        return value
    return json.loads(text)
