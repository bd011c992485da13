"""Work for `oomdoctor.load.folder.read_beside`'s worker in tests: the worker is a new interpreter,
which imports these by name (nothing a test patches reaches it)."""

from __future__ import annotations

import os
import sys
import time


def echo(path: str) -> tuple[str, int]:
    return path, os.getpid()


def noisy(path: str) -> str:
    print("on standard output, where the answer goes")
    print("and on standard error", file=sys.stderr)
    return path


def fails(path: str) -> str:
    raise ValueError(path)


def dies(path: str) -> str:
    os._exit(3)


def sleeps(path: str) -> str:
    time.sleep(60)
    return path
