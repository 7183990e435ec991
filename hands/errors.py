"""Hands' one home for failures: ``ToolFailure`` and the mapping of any exception to the wire's error."""

from __future__ import annotations

import errno
from typing import Any

from bus.errors import PincerError
from bus.protocol import RETRYABLE, ErrorCode, ToolError
from bus.workspace import PathRefused

# Whether the model can usefully try again (as is, later, or with changed arguments).
RECOVERABLE = RETRYABLE | {
    ErrorCode.TOOL_NOT_FOUND,
    ErrorCode.INVALID_ARGUMENTS,
    ErrorCode.FILE_NOT_FOUND,
    ErrorCode.QUEUE_FULL,
    ErrorCode.QUEUE_TIMEOUT,
    ErrorCode.TOOL_ERROR,
    ErrorCode.RESOURCE_EXHAUSTED,
    ErrorCode.RETRY_EXHAUSTED,
}


class ToolFailure(PincerError):
    """Raised by tools and the engine; becomes a ``tool:result`` error the LLM can act on."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        suggestions: list[str] | None = None,
        details: dict[str, Any] | None = None,
        recoverable: bool | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.suggestions = suggestions or []
        self.details = details
        self.recoverable = code in RECOVERABLE if recoverable is None else recoverable
        # Worth running again as is? (A missing configuration is not, whatever its code.)
        self.retryable = code in RETRYABLE if retryable is None else retryable

    def to_error(self) -> ToolError:
        return ToolError(
            code=self.code, message=self.message, recoverable=self.recoverable,
            suggestions=self.suggestions, details=self.details,
        )


_OS_ERRORS: dict[int, tuple[ErrorCode, str]] = {
    errno.ENOENT: (ErrorCode.FILE_NOT_FOUND, "no such file or directory"),
    errno.ENOTDIR: (ErrorCode.FILE_NOT_FOUND, "a part of the path is not a directory"),
    errno.EISDIR: (ErrorCode.INVALID_ARGUMENTS, "the path is a directory, not a file"),
    errno.ELOOP: (ErrorCode.PERMISSION_DENIED, "the path goes through a symbolic link, which tools do not follow"),
    errno.EACCES: (ErrorCode.PERMISSION_DENIED, "access denied by the operating system"),
    errno.EPERM: (ErrorCode.PERMISSION_DENIED, "operation not permitted"),
    errno.EEXIST: (ErrorCode.INVALID_ARGUMENTS, "the path already exists"),
    errno.ENOSPC: (ErrorCode.RESOURCE_EXHAUSTED, "no space left on the device"),
    errno.EFBIG: (ErrorCode.RESOURCE_EXHAUSTED, "the file is too large"),
    errno.ENAMETOOLONG: (ErrorCode.INVALID_ARGUMENTS, "the path name is too long"),
}


def to_tool_error(exc: BaseException) -> ToolError:
    """Any exception a tool raised, as the wire's error; unknown ones are ``UNHANDLED``."""
    if isinstance(exc, ToolFailure):
        return exc.to_error()
    if isinstance(exc, PathRefused):  # the workspace boundary's refusal
        recoverable = exc.code in RECOVERABLE if exc.recoverable is None else exc.recoverable
        return ToolError(code=exc.code, message=exc.message, recoverable=recoverable, suggestions=exc.suggestions)
    if isinstance(exc, OSError) and exc.errno in _OS_ERRORS:
        code, what = _OS_ERRORS[exc.errno]
        where = f": {exc.filename}" if exc.filename else ""
        return ToolError(code=code, message=f"{what}{where}", recoverable=code in RECOVERABLE)
    return ToolError(
        code=ErrorCode.UNHANDLED,
        message=f"the tool failed unexpectedly ({type(exc).__name__}: {exc})",
        details={"exception": type(exc).__name__},
    )
