"""Tries to leave files on the host."""

# ruff: noqa: F821 - the test fills in the __NAMES__ before the sandbox runs it

for path in __TARGETS__:
    try:
        with open(path, "w") as out:
            out.write("escaped")
        print("wrote", path)
    except OSError as error:
        print("no", path, error.strerror)
