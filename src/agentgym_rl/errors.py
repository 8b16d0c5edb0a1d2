"""The one exception type for user mistakes, and the errors of a disk a run cannot write.

The CLI turns a `UserError` into a one-line message and exit code 2; anything else is a bug
and keeps its traceback.
"""

import errno

DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
"""What writing a run meets when its disk is full, over quota or read-only (the run then stops
with one line, not a traceback)."""


class UserError(Exception):
    """Bad input from the user: unknown name, missing file, malformed config or override."""
