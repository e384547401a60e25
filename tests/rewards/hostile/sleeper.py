"""Never ends, uses no CPU: only the wall limit stops it."""

import time

time.sleep(3600)
