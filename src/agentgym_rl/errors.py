"""The one exception type for user mistakes.

The CLI turns a `UserError` into a one-line message and exit code 2; anything else is a bug
and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user: unknown name, missing file, malformed config or override."""
