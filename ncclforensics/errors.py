"""User-facing errors: each carries one line of text and the CLI exit code it maps to."""


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


class UnsafeInputError(Exception):
    """Raised inside ingest for one source; becomes a Skipped entry, never a crash."""
