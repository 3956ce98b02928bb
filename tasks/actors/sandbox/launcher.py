"""The sandbox's child side: isolates itself, sets its limits, then execs the code.

Run as `python -I -S launcher.py PYTHON STATUS_FD CPU_S MEMORY_MB OUTPUT_BYTES` in the
code's working directory. Standard library only, and little of it: it starts once per
run. A failure to isolate is written to STATUS_FD (the parent raises on it) and nothing
runs; on success STATUS_FD is closed before the code starts.
"""

import os
import sys

NOBODY = 65534
SCRIPT = "main.py"  # the code, written into the working directory by the parent

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
# Flags a remount must repeat: in a user namespace the kernel refuses to clear them.
_KEPT_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
               "relatime": 1 << 21, "strictatime": 1 << 24}


def _isolate(work: str) -> None:
    """New network and mount namespaces; every mount but `work` read-only; then nobody."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(ret: int, what: str) -> None:
        if ret != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(_CLONE_NEWNET | _CLONE_NEWNS | (0 if root else _CLONE_NEWUSER)), "unshare")
    if not root:  # keep our own ids inside the user namespace
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "private /")
    check(libc.mount(work.encode(), work.encode(), None, _MS_BIND, None), f"bind {work}")
    os.chdir(work)  # onto the new mount: the old cwd lies on a mount about to turn read-only
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        target = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
        if target == work:
            continue
        flags = sum(_KEPT_FLAGS.get(opt, 0) for opt in fields[5].split(","))
        check(libc.mount(None, target.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags, None),
              f"read-only {target}")
    if root:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def _launch(python: str, status_fd: int, cpu_s: int, memory_mb: int, output_bytes: int) -> None:
    import resource

    try:
        _isolate(os.getcwd())
    except OSError as e:
        os.write(status_fd, f"sandbox isolation failed: {e}".encode())
        os._exit(125)
    os.close(status_fd)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.execv(python, [python, "-I", "-S", SCRIPT])


if __name__ == "__main__":
    _launch(sys.argv[1], *map(int, sys.argv[2:]))
