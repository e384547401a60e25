"""Hoards memory where no address space counts it: SysV shared memory, detached after
each segment is filled."""

import ctypes

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
SEGMENT = 32 << 20
held = 0
while held < 1 << 40:
    segment = libc.shmget(0, SEGMENT, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if segment < 0:
        print("shmget refused", ctypes.get_errno(), flush=True)
        break
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, SEGMENT)
    libc.shmdt(ctypes.c_void_p(address))
    held += SEGMENT
    print("held", held, flush=True)
