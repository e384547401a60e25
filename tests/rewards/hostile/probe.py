"""Harmless: reports what the sandbox lets a program see, then stays a moment so the host
can look at its processes."""

# ruff: noqa: F821 - the test fills in the __NAMES__ before the sandbox runs it

import json
import os
import resource
import socket
import subprocess
import time

LIMITS = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")
nested = subprocess.run(["unshare", "--user", "true"], capture_output=True)
with open("/proc/1/cmdline", "rb") as cmdline:
    pid1 = cmdline.read().split(b"\0")[0].decode()
seen = {
    "uid": os.getuid(),
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "sid": os.getsid(0),
    "pid1": pid1,
    "hostname": socket.gethostname(),
    "interfaces": [name for _, name in socket.if_nameindex()],
    "tmp": os.listdir("/tmp"),
    "root": sorted(os.listdir("/")),
    "dev": sorted(os.listdir("/dev")),
    "cwd": os.getcwd(),
    "environ": dict(os.environ),
    "limits": {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS},
    "nested_userns_exit": nested.returncode,
}
print(json.dumps(seen), flush=True)
time.sleep(__HOLD_S__)
