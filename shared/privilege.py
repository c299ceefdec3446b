"""Process hardening for isolated inference, through the C library (Linux; elsewhere a no-op).

- :func:`undumpable`: a worker process marks itself not dumpable, so that no other process of
  its user without ``CAP_SYS_PTRACE`` can read its ``/proc/<pid>/environ`` (the Redis URL and
  password) or ``/proc/<pid>/mem`` (rows with labels, the shard cache).
- :func:`drop_capabilities`: an isolated model's subprocess gives up every capability before
  it loads the caller-facing code, so that even a worker running as root leaves it no
  ``CAP_SYS_PTRACE`` to read its parent's memory with.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["drop_capabilities", "undumpable"]

_PR_SET_DUMPABLE = 4
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def undumpable() -> bool:
    """Mark this process not dumpable; False where that is not possible (not Linux)."""
    libc = _libc()
    if libc is None:
        return False
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    return True


def drop_capabilities() -> bool:
    """Clear this process's effective, permitted and inheritable capabilities for good;
    False where that is not possible (not Linux)."""
    libc = _libc()
    if libc is None:
        return False
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset() failed")
    return True
