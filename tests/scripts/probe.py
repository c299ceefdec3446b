"""A scorer script for the pool tests: ``main([command, *args])`` does one misbehaviour."""

from __future__ import annotations

import os
import signal
import sys
import time


def main(argv: list[str]) -> str:
    command, *args = argv
    if command == "env":
        return os.environ.get(args[0], "<unset>")
    if command == "pid":
        return str(os.getpid())
    if command == "dumpable":  # prctl(PR_GET_DUMPABLE)
        import ctypes

        return str(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))
    if command == "write":
        before = sorted(os.listdir("."))
        with open(args[0], "w") as handle:
            handle.write("left behind")
        return ",".join(before)
    if command == "ls":
        return ",".join(sorted(os.listdir(".")))
    if command == "sleep":
        time.sleep(float(args[0]))
        return "slept"
    if command == "burn":
        until = time.process_time() + float(args[0])
        while time.process_time() < until:
            pass
        return "burnt"
    if command == "spin":
        while True:
            pass
    if command == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if command == "exit":
        sys.exit(3)
    if command == "alloc":
        block = bytearray(int(args[0]) * 1024 * 1024)
        return str(len(block))
    if command == "raise":
        raise ValueError("bad output")
    if command == "print":
        print("noise on stdout")
        return "answered"
    return "unknown"


if __name__ == "__main__":
    print(main(sys.argv[1:]))
