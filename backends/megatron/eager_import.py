"""Importing this module imports ``megatron.core`` as a CPU process runs it, without its
compiled helpers (:func:`backends.megatron.cpu_compat.import_megatron_eager`).

For the preload list of the CPU ranks' fork server (benchmarks/harness/spawn.py), which
can only name modules to import. Never import it in a process that computes on an
accelerator: Megatron's helpers would stay uncompiled there.
"""

from backends.megatron.cpu_compat import import_megatron_eager

import_megatron_eager()
