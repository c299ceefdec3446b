"""A seccomp filter that takes the network away from a process and every program it executes:
``socket()`` fails (``EACCES``) for every address family — TCP and UDP, IPv4 and IPv6, UNIX
sockets by path or abstract name, netlink, vsock — and so does ``io_uring_setup()`` (``EPERM``),
whose rings could open sockets without a ``socket()`` call. ``socketpair()`` and pipes still
work: they reach nothing outside the process.

Linux 3.5 and newer (``CONFIG_SECCOMP_FILTER``), x86-64 and arm64; no privilege needed, but it
sets ``no_new_privs``. A system call of another ABI (a 32-bit call from a 64-bit process, x32)
fails with ``EPERM``, so the filter cannot be stepped around that way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

from evalq.shared.isolation.privilege import c_library, no_new_privs

__all__ = ["deny_sockets"]

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_X32_BIT = 0x40000000

# machine: (AUDIT_ARCH_*, socket, io_uring_setup)
_ARCHES = {
    "x86_64": (0xC000003E, 41, 425),
    "aarch64": (0xC00000B7, 198, 425),
}


class _Filter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _Program(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter)))


def _program(machine: str) -> list[tuple[int, int, int, int]]:
    arch, socket_nr, io_uring_nr = _ARCHES[machine]
    deny = _RET_ERRNO | errno.EPERM
    code = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, arch),  # this ABI: skip the next line
        (_RET_K, 0, 0, deny),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if machine == "x86_64":
        code += [(_JGE_K, 0, 1, _X32_BIT), (_RET_K, 0, 0, deny)]
    for number, refusal in ((socket_nr, errno.EACCES), (io_uring_nr, errno.EPERM)):
        code += [(_JEQ_K, 0, 1, number), (_RET_K, 0, 0, _RET_ERRNO | refusal)]
    return [*code, (_RET_K, 0, 0, _RET_ALLOW)]


def deny_sockets() -> None:
    """Install the filter on this thread and what it starts afterwards (call it while the
    process has one thread); OSError where the kernel or the machine does not allow it."""
    machine = platform.machine()
    if not sys.platform.startswith("linux") or machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {sys.platform} on {machine}")
    code = _program(machine)
    filters = (_Filter * len(code))(*(_Filter(*line) for line in code))
    program = _Program(len(code), filters)
    libc = c_library()
    assert libc is not None  # Linux, checked above
    no_new_privs(libc)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP) failed: {os.strerror(err)}")
