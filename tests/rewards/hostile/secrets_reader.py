"""Looks for the trainer's secrets: its environment, a file it holds, other processes."""

# ruff: noqa: F821 - the test fills in the __NAMES__ before the sandbox runs it

import glob
import os

print("environ", dict(os.environ))
for path in [__SECRET_FILE__, "/proc/1/environ", *glob.glob("/proc/*/environ")]:
    try:
        with open(path, "rb") as handle:
            print("read", path, handle.read())
    except OSError as error:
        print("no", path, error.strerror)
print("done", flush=True)
