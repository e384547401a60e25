"""Calls listeners on the host's loopback: TCP, UDP and an abstract unix socket."""

# ruff: noqa: F821 - the test fills in the __NAMES__ before the sandbox runs it

import socket

for address in __TCP__:
    try:
        socket.create_connection(address, timeout=1).close()
        print("connected", address)
    except OSError as error:
        print("refused", address, error.strerror)
for address in __UDP__:
    try:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.sendto(b"hello", address)
        print("sent", address)
    except OSError as error:
        print("unsent", address, error.strerror)
try:
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.connect(__ABSTRACT__)
    print("connected abstract")
except OSError as error:
    print("refused abstract", error.strerror)
