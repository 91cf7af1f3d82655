"""The CLI's error for a problem with the user's files or inputs (exit status 1).

Shared by the commands (`cli_compile_run`, `cli_bench`) and `cli.main`, which
prints it; misuse (exit status 2) is `support.diagnostics.UsageError`.
"""


class UserError(Exception):
    """A problem with the user's files or inputs: printed as `error: ...`, exit 1."""
