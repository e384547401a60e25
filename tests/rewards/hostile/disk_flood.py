"""Fills every writable place it can find, then says how much it wrote."""

import os

written = 0
places = ("/tmp", "/", "/dev/shm", "/usr", os.path.expanduser("~"))
for index, place in enumerate(places):
    try:
        with open(os.path.join(place, f"flood-{index}.bin"), "wb") as out:
            while written < (1 << 34):
                out.write(b"\0" * (1 << 20))
                written += 1 << 20
    except OSError as error:
        print(place, "stopped:", error.strerror)
print("written", written, flush=True)
