"""What every module says to the user: a ScriptError (error + fix) or a line of progress on stderr."""

from __future__ import annotations

import contextlib
import errno
import sys
from typing import Any

from epyc.masking import clip, mask_secrets

EXIT_OK = 0
EXIT_FAIL = 1


class ScriptError(Exception):
    """A failure the user can act on: printed as {"error", "fix"} with an exit code."""

    def __init__(self, error: str, fix: str, code: int = EXIT_FAIL, **extra: Any):
        super().__init__(error)
        self.error = error
        self.fix = fix
        self.code = code
        self.extra = extra

    def as_json(self) -> dict:
        return {"error": self.error, "fix": self.fix, **self.extra}


def log(msg: str) -> None:
    """Progress and diagnostics go to stderr; stdout carries only the JSON document."""
    if sys.stderr is None:  # started with stderr closed: print would then write to stdout
        return
    with contextlib.suppress(OSError, ValueError):  # stderr full (`2>/dev/full`) or closed: progress is lost
        print(mask_secrets(msg), file=sys.stderr, flush=True)


def os_error(exc: OSError, doing: str) -> ScriptError:
    """The machine's refusal (a full disk, a folder we may not write, a link loop) in words a user acts on."""
    where = f" ({clip(str(exc.filename), 300)})" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = "free space on that disk (or raise the file-size limit, ulimit -f), then run it again"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "check that folder's permissions, or use another folder, then run it again"
    else:
        fix = "check the file or folder it names, then run it again"
    return ScriptError(f"{doing}: {exc.strerror or exc or type(exc).__name__}{where}", fix)
