"""User-facing errors: each one line of text, with the CLI exit code it maps to."""


class ForensicsError(Exception):
    """A fatal user error: printed as one line, mapped to an exit code (DESIGN.md §4)."""

    exit_code = 4

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(ForensicsError):
    exit_code = 2


class NoInputError(ForensicsError):
    """Missing path, or nothing analysable under it."""

    exit_code = 3


class CatalogueError(ForensicsError):
    """The pattern catalogue (patterns/) is missing or empty: a broken installation, exit 4."""

    exit_code = 4

    def __init__(self, detail: str) -> None:
        super().__init__(f"internal error: the pattern catalogue is missing or empty ({detail}); "
                         "reinstall ncclforensics")


class UnsafeInputError(Exception):
    """Raised inside ingest for one source; becomes a Skipped entry, never a crash."""


class PatternError(ForensicsError):
    """A file under patterns/ is malformed (a rule, a signature, a meaning): one line naming the file, exit 4."""

    exit_code = 4

