"""Config values that name a class to import: ``"package.module:ClassName"`` (``env.cls``).

The form is checked with the rest of the config (mindrl/config/validate.py), before any
import; the environments' loader (mindrl/envs/base.py) imports the class at start-up and
splits the path with the same function.
"""

from __future__ import annotations


class EnvConfigError(ValueError):
    """``env.cls`` cannot be loaded or built; the message says what to change."""


def split_class_path(path: str) -> tuple[str, str]:
    """``"package.module:ClassName"`` -> ``("package.module", "ClassName")``.

    Raises:
        EnvConfigError: ``path`` is not of that form.
    """
    module, sep, name = path.partition(":")
    if not sep or not module or not name.isidentifier() or ":" in name:
        raise EnvConfigError(
            f"env.cls {path!r}: expected 'package.module:ClassName' (a module on PYTHONPATH, "
            "a colon, the class)"
        )
    return module, name
