"""Starts sleeping children until the kernel refuses one, and says how many it got."""

import os
import time

started = 0
while started < 1000:
    try:
        pid = os.fork()
    except OSError as error:
        print("refused", error.errno)
        break
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    started += 1
print("started", started, flush=True)
