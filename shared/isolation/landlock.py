"""Landlock, through the C library: an unprivileged process restricts itself, and every program
it executes, to the files it names and to no TCP (Linux 5.13 and newer, with ``landlock`` in the
kernel's LSM list; ``/sys/kernel/security/lsm`` shows it where securityfs is mounted).

What is restricted grows with the kernel's Landlock ABI: files (1, Linux 5.13; linking and
renaming across folders 2, 5.19; truncating 3, 6.2), TCP ``bind``/``connect`` (4, 6.7), ``ioctl``
on devices (5, 6.10), and abstract UNIX sockets and signals to processes outside the sandbox (6,
6.12). :func:`abi` says which the kernel has; :func:`restrict` handles every right of that ABI,
so whatever is not granted by a rule is refused. The restriction holds for the calling thread
and what it starts afterwards: call it while the process has one thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterable

from evalq.shared.isolation.privilege import c_library, no_new_privs

__all__ = [
    "FILE_RIGHTS",
    "IOCTL",
    "READ",
    "READ_WRITE",
    "WRITE",
    "abi",
    "restrict",
]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same number on every arch
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = EXECUTE | READ_FILE | READ_DIR
"""Read files and list folders beneath a path, and execute its programs."""
WRITE = WRITE_FILE | TRUNCATE
"""Write existing files (a device such as ``/dev/null``)."""
IOCTL = IOCTL_DEV
"""``ioctl`` on device files (a GPU's)."""
READ_WRITE = ((1 << 16) - 1) & ~(MAKE_CHAR | MAKE_BLOCK)
"""Everything in a folder of one's own: create, write, rename and delete beneath it."""
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights that apply to a file that is not a folder (a rule on one may grant only these)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _fail(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what} failed: {os.strerror(code)}")


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, a kernel built
    without it, or Landlock left out of the LSMs it boots with)."""
    libc = c_library()
    if libc is None:
        return 0
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def restrict(rules: Iterable[tuple[str, int]], *, version: int) -> list[str]:
    """Allow this process only what ``rules`` grant — ``(path, rights)``, rights from this
    module's constants, each path's whole tree; a path that does not exist is skipped — and no
    TCP ``bind`` or ``connect`` at all. ``version`` is :func:`abi`'s answer (at least 1). What
    was restricted beyond files, by name: ``tcp`` (ABI 4) and ``scope`` (ABI 6, abstract UNIX
    sockets and signals outside the sandbox). Raises OSError when the kernel refuses."""
    libc = c_library()
    if libc is None or version < 1:
        raise OSError(errno.ENOSYS, "Landlock is not available")
    handled_fs = _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= version)]
    attr = _RulesetAttr(handled_fs, 0, 0)
    size, extras = 8, []
    if version >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP  # and no rule allows any
        size, extras = 16, ["tcp"]
    if version >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        size, extras = 24, [*extras, "scope"]
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise _fail("landlock_create_ruleset()")
    try:
        for path, rights in rules:
            _add(libc, int(ruleset), path, rights & handled_fs)
        no_new_privs(libc)
        if libc.syscall(_RESTRICT_SELF, int(ruleset), 0) != 0:
            raise _fail("landlock_restrict_self()")
    finally:
        os.close(ruleset)
    return extras


def _add(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS
        if not rights:
            return
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise _fail(f"landlock_add_rule({path})")
    finally:
        os.close(fd)
