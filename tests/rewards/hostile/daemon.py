"""Double-forks a session leader that sleeps, to outlive the program and its kill."""

import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
    os._exit(0)
print("left a daemon behind", flush=True)
