"""The code's interpreter: which Python runs the code, and what of its installation the
jail mounts for it."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import sysconfig

from tasks.actors.sandbox.result import SandboxUnavailable

# The jail mounts these directories whole (jail/rootfs.py): nothing under them needs a mount of its own.
_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/")


@functools.cache
def code_interpreter() -> tuple[str, tuple[str, ...]]:
    """The code's interpreter (a real path) and what of its installation to mount: the
    binary itself and its prefix's lib directories (the standard library, libpython, the
    libraries its extension modules link), not the whole prefix, which may be a home."""
    python = os.path.realpath(sys.executable)
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    if os.geteuid() == 0 and os.stat(python).st_mode & 0o005 != 0o005:
        system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        if system is None or os.stat(system).st_mode & 0o005 != 0o005:
            raise SandboxUnavailable(f"{python} is not runnable by others and there is no system python3")
        python = os.path.realpath(system)
        prefixes = {os.path.dirname(os.path.dirname(python))}
    binds = {python} | {os.path.join(p, lib) for p in prefixes for lib in ("lib", "lib64")}
    libdir = sysconfig.get_config_var("LIBDIR")  # a shared libpython, if it is elsewhere
    if libdir and python == os.path.realpath(sys.executable):
        binds.add(os.path.realpath(libdir))
    return python, tuple(sorted(b for b in binds if os.path.exists(b) and not (b + "/").startswith(_SYSTEM_PREFIXES)))
