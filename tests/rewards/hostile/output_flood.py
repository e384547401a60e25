"""Writes to stdout and stderr without end."""

import os

line = b"flood " * 10000
while True:
    os.write(1, line)
    os.write(2, line)
