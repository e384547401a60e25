# ruff: noqa: F821  -- the sandbox runs these after the program, in its namespace, where add is defined
assert add(2, 3) == 5
assert add(-1, 1) == 0
