"""Process hardening for isolated inference, through the C library (Linux; elsewhere a no-op).

- :func:`undumpable`: a worker process marks itself not dumpable, so that no other process of
  its user without ``CAP_SYS_PTRACE`` can read its ``/proc/<pid>/environ`` (the Redis URL and
  password) or ``/proc/<pid>/mem`` (rows with labels, the shard cache).
- :func:`c_library` and :func:`no_new_privs`: the C library the interpreter loaded, and the
  ``no_new_privs`` bit every confinement here (capabilities, Landlock, seccomp) sets first.
- :func:`drop_capabilities`: an isolated model's subprocess gives up every capability for
  good before it loads the caller-facing code: the bounding set (when it may change it), then
  ``no_new_privs``, then its own sets. Even under a worker running as root it has no
  ``CAP_SYS_PTRACE`` to read its parent's memory with, and neither has any program it executes
  (uid 0 otherwise regains every capability at ``execve``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from pathlib import Path

__all__ = ["c_library", "drop_capabilities", "no_new_privs", "undumpable"]

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def c_library() -> ctypes.CDLL | None:
    """The C library the interpreter already loaded (finding it by name would run
    ``ldconfig``), with ``errno`` kept and ``syscall`` answering a long; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    loaded = ctypes.CDLL(None, use_errno=True)
    loaded.syscall.restype = ctypes.c_long
    return loaded


def no_new_privs(loaded: ctypes.CDLL) -> None:
    """Set this process's ``no_new_privs``: no program it executes gains privileges (and an
    unprivileged process may then install seccomp filters and Landlock rules)."""
    if loaded.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(code)}")


def undumpable() -> bool:
    """Mark this process not dumpable; False where that is not possible (not Linux)."""
    libc = c_library()
    if libc is None:
        return False
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    return True


def drop_capabilities() -> bool:
    """Give up every capability for good, this process's and its future programs'; False
    where that is not possible (not Linux)."""
    libc = c_library()
    if libc is None:
        return False
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for capability in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            if code != errno.EPERM:  # EPERM: no CAP_SETPCAP, so nothing to drop from it either
                raise OSError(code, "prctl(PR_CAPBSET_DROP) failed")
            break
    no_new_privs(libc)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset() failed")
    return True
