"""Numeric-answer checker, a scorer script: ``python check_number.py OUTPUT EXPECTED`` prints 1
when OUTPUT is EXPECTED within a relative tolerance (env ``CHECK_TOLERANCE``, default 1e-6),
else 0.

It imports sympy on purpose: half a second of import per call is what a cold scorer pays every
time and a warm one pays once. Only plain numbers (``-12``, ``2.5``, ``7/3``) are parsed, with
``sympy.Rational``, which never evaluates the text as code.
"""

from __future__ import annotations

import os
import re
import sys

import sympy

_NUMBER = re.compile(r"^\s*-?\d+(\.\d+)?(/\d+)?\s*$")


def main(argv: list[str]) -> str:
    output, expected = argv[0], argv[1]
    if not _NUMBER.match(output) or not _NUMBER.match(expected):
        return "0"
    tolerance = float(os.environ.get("CHECK_TOLERANCE", "1e-6"))
    got, want = sympy.Rational(output.strip()), sympy.Rational(expected.strip())
    return "1" if abs(got - want) <= tolerance * max(1, abs(want)) else "0"


if __name__ == "__main__":
    print(main(sys.argv[1:]))
