"""What the caller and the jail agree on: where the code is and runs, its uid, and the
status lines the jail writes to STATUS_FD (the code never holds that fd):

    init PID                  the init's pid in the caller's namespace
    exit WAITSTATUS REASON    the code's end; REASON is `cpu`, `memory` or `-`
    error MESSAGE             the jail could not be built; nothing ran

The caller imports this module too (the jail imports nothing of the caller's).
"""

import os

SCRIPT = "main.py"  # the code, written into the run's directory by the parent
WORK = "/work"  # the code's directory inside the jail: a tmpfs of its own
UID_BASE = 0x70000000  # as root, the code runs as UID_BASE + the launcher's pid: one uid per run


class Failure(Exception):
    """The jail could not be built; reported on the status fd."""


def fail(status: int, e: Exception) -> None:
    """Reports why the jail could not be built, and exits: nothing of the code has run."""
    message = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.filename else str(e)
    os.write(status, f"error sandbox isolation failed: {message}\n".encode())
    os._exit(125)
