"""The isolated model host's sandbox: no network, and no file but what running the model needs.

:func:`confine` applies every layer the machine allows, each on its own, and says which it
applied and why any other is missing; the host reports that to its worker, which logs it:

- ``seccomp``: ``socket()`` and ``io_uring`` refused (:mod:`evalq.shared.isolation.seccomp`); where
  the kernel refuses the filter, ``netns`` instead: a user and network namespace of its own
  (unprivileged user namespaces), whose only device is a loopback that is down;
- ``landlock``: reads only beneath the Python installation (``sys.prefix`` and
  ``sys.base_prefix``, every ``sys.path`` folder, every package already imported), the plugin
  packages, the evaluation's ``model_files``, the system's libraries and programs (``/usr``,
  ``/lib*``, ``/bin``, ``/sbin``), a few files of ``/etc`` the C library reads, its own
  ``/proc/self``, the CPU's description, and on a GPU its device files, ``/proc/driver/nvidia``
  and ``/sys``; writes only in its own folder (``HOME``) and to ``/dev/null``. Not the data
  files, the shard cache, the archive, the Hugging Face caches, other processes' ``/proc``
  files, nor anything else a worker's user may read (:mod:`evalq.shared.isolation.landlock`);
- ``landlock-tcp``: no TCP ``bind`` or ``connect`` (Landlock ABI 4);
- ``landlock-scope``: no signal to, and no abstract UNIX socket of, a process outside the
  sandbox (Landlock ABI 6).

It holds for the host and every program it executes; call :func:`confine` while the process
has one thread, after it gave up its capabilities
(:func:`evalq.shared.isolation.privilege.drop_capabilities`).
"""

from __future__ import annotations

import ctypes
import errno
import glob
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from evalq.shared.isolation import landlock, seccomp
from evalq.shared.isolation.privilege import c_library, drop_capabilities

__all__ = ["confine", "python_paths"]

SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")
ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/os-release",
    "/etc/mime.types",
)
CPU = ("/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu", "/sys/devices/system/node")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
GPU_READ = ("/proc/driver/nvidia", "/sys")
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_KERNEL = {4: "6.7", 6: "6.12"}


def python_paths(modules: Iterable[str] = ()) -> list[str]:
    """Where this interpreter imports from: its prefixes, the folders on ``sys.path``, the
    folders of every package imported so far, and those of ``modules``' top-level packages
    (found without running them)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.add(str(Path(sys.executable).resolve().parent))
    paths.update(entry for entry in sys.path if os.path.isabs(entry))
    for module in list(sys.modules.values()):
        paths.update(str(entry) for entry in getattr(module, "__path__", None) or ())
    for name in modules:
        top = name.partition(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            paths.update(spec.submodule_search_locations or ())
            if spec.origin and os.path.isabs(spec.origin):
                paths.add(spec.origin)
    return sorted(p for p in paths if os.path.exists(p))


def _rules(read: Iterable[str], home: str | None, gpu: bool) -> Iterator[tuple[str, int]]:
    for path in (*SYSTEM, *ETC, *CPU, *read):
        yield path, landlock.READ
    yield "/proc/self", landlock.READ_FILE | landlock.READ_DIR
    for path in DEVICES:
        yield path, landlock.READ_FILE | landlock.WRITE
    if home:
        yield home, landlock.READ_WRITE
    if gpu:
        for path in GPU_READ:
            yield path, landlock.READ
        for path in (*GPU_DEVICES, *sorted(glob.glob("/dev/nvidia[0-9]*")), "/dev/nvidia-caps"):
            yield path, landlock.READ | landlock.WRITE | landlock.IOCTL


def _network_namespace() -> None:
    """A user and network namespace of this process's own, with its user and group mapped to
    themselves, and every capability the new namespace granted given up again. User 0 stays
    unmapped (the overflow user inside): mapping it needs ``CAP_SETFCAP``, given up already."""
    uid, gid = os.geteuid(), os.getegid()
    libc = c_library()
    if libc is None:
        raise OSError(errno.ENOSYS, "namespaces are Linux's")
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWUSER | CLONE_NEWNET) failed: {os.strerror(code)}")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    if uid != 0:
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    drop_capabilities()


def confine(
    *,
    modules: Iterable[str] = (),
    files: Iterable[str] = (),
    home: str | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Sandbox this process: reads as listed above plus the packages of ``modules`` (the
    plugins) and ``files`` (absolute paths: the model's own), everything in ``home``, no
    network. Returns ``{"applied": [layer, ...], "missing": {layer: why}}``; a layer the
    machine refuses is missing, never an error."""
    applied: list[str] = []
    missing: dict[str, str] = {}
    try:
        seccomp.deny_sockets()
        applied.append("seccomp")
    except OSError as exc:
        missing["seccomp"] = str(exc)
        try:
            _network_namespace()
            applied.append("netns")
        except OSError as why:
            missing["netns"] = f"{why} (needs unprivileged user namespaces)"
    version = landlock.abi()
    if version < 1:
        missing["landlock"] = "this kernel has no Landlock (Linux 5.13+, 'landlock' in its LSMs)"
        return {"applied": applied, "missing": missing}
    read = [*python_paths(modules), *(f for f in files if os.path.isabs(f))]
    try:
        extras = landlock.restrict(_rules(read, home, device.startswith("cuda")), version=version)
    except OSError as exc:
        missing["landlock"] = str(exc)
        return {"applied": applied, "missing": missing}
    applied += ["landlock", *(f"landlock-{extra}" for extra in extras)]
    for abi, extra in ((4, "tcp"), (6, "scope")):
        if extra not in extras:
            missing[f"landlock-{extra}"] = f"Landlock ABI {version} < {abi} (Linux {_KERNEL[abi]}+)"
    return {"applied": applied, "missing": missing}
