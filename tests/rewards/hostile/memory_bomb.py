"""Lifts its own limits first (or tries to), then allocates without end."""

import resource

for name in ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_NPROC"):
    try:
        unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        resource.setrlimit(getattr(resource, name), unlimited)
        print("raised", name, flush=True)
    except (ValueError, OSError) as error:
        print("refused", name, error, flush=True)
hoard = []
while True:
    hoard.append(bytearray(16 << 20))
