"""The one error type of the dock."""


class DockError(RuntimeError):
    """A dock request failed: bad put, dead actor, or a stage that waited too long.

    The message is one line naming the field, stage or actor at fault and, where there
    is one, the fix.
    """
