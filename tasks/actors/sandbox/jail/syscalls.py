"""What the jail asks of the kernel beyond the standard library's `os`, without the
wrappers that cost milliseconds to import: libc calls through `_ctypes` (`ctypes` costs
~5 ms), the kernel's numbers for them (the `signal` module is a Python import too), and
whole-file reads and writes on plain close-on-exec fds."""

import os

from protocol import Failure

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SIGKILL, SIGCHLD, SIGXCPU = 9, 17, 24


class Libc:
    """The few libc calls the stdlib lacks; a failed one raises `Failure` with its errno."""

    def __init__(self):
        import _ctypes

        class Int(_ctypes._SimpleCData):
            _type_ = "i"

        class Func(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = Int

        class Lib:
            _handle = _ctypes.dlopen(None, 0)

        self._ctypes, self._func, self._lib = _ctypes, Func, Lib

    def __call__(self, name: str, *args, what: str = ""):
        ret = self._func((name, self._lib))(*args)
        if ret < 0:
            errno = self._ctypes.get_errno()
            raise Failure(f"{what or name}: {os.strerror(errno)}")
        return ret


def write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_file(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 20).decode(errors="replace")
    finally:
        os.close(fd)
