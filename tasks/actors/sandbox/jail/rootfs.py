"""The jail's root, built by the init: a tmpfs holding the host's system directories and
the code's interpreter (read-only), a minimal /etc, a few /dev nodes, a fresh /proc and
the /work tmpfs; then pivot_root into it, so that no path leads outside."""

import os

from protocol import SCRIPT, WORK, Failure
from syscalls import read_file, write_file

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
# Flags a read-only remount must repeat: in a user namespace the kernel refuses to clear them.
_KEPT_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
               "relatime": 1 << 21, "strictatime": 1 << 24}
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
# What the jail shows of the host: these, read-only (or as the same symlinks).
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom")


def build_root(cfg: dict, libc) -> None:
    """Mounts the jail's root on `root/` (under the run's directory) and pivots into it."""
    new = os.path.abspath("root").encode()
    libc("mount", b"none", b"/", None, _MS_REC | _MS_PRIVATE, None, what="private /")
    os.mkdir(new, 0o755)
    libc("mount", b"tandem-sandbox", new, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=1m,nr_inodes=1024",
         what="tmpfs root")
    new = new.decode()
    _mount_system(libc, new, cfg["binds"])
    for name in ("etc", "dev", "dev/shm", "tmp", "proc", "work"):
        os.makedirs(f"{new}/{name}", 0o755, exist_ok=True)
    _write_etc(new, cfg["uid"], cfg["gid"])
    _make_dev(libc, new)
    libc("mount", b"proc", f"{new}/proc".encode(), b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None,
         what="mount /proc")
    _mount_work(libc, new, cfg)
    _make_read_only(libc, new, writable={f"{new}{WORK}", f"{new}/proc"} | {f"{new}/dev/{name}" for name in _DEVICES})
    _pivot(libc, new)


def _mount_system(libc, new: str, binds: list) -> None:
    for name in _SYSTEM_DIRS:
        source = "/" + name
        if os.path.islink(source):
            os.symlink(os.readlink(source), f"{new}/{name}")
        elif os.path.isdir(source):
            _bind(libc, source, f"{new}/{name}")
    for source in binds:  # the interpreter and its libraries, where they are not under /usr
        _bind(libc, source, new + source)


def _bind(libc, source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, 0o755, exist_ok=True)
    else:  # a file: the mount point is an empty file
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
    libc("mount", source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None, what=f"bind {source}")


def _write_etc(new: str, uid: int, gid: int) -> None:
    write_file(f"{new}/etc/passwd", "root:x:0:0::/:/usr/sbin/nologin\n"
                                    f"sandbox:x:{uid}:{gid}::{WORK}:/usr/sbin/nologin\n"
                                    "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n")
    write_file(f"{new}/etc/group", f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n")
    if os.path.exists("/etc/ld.so.cache"):  # libraries outside the loader's default directories
        with open("/etc/ld.so.cache", "rb") as src, open(f"{new}/etc/ld.so.cache", "wb") as dst:
            dst.write(src.read())
    if os.path.islink("/etc/localtime"):
        os.symlink(os.readlink("/etc/localtime"), f"{new}/etc/localtime")


def _make_dev(libc, new: str) -> None:
    for name in _DEVICES:
        os.close(os.open(f"{new}/dev/{name}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
        libc("mount", f"/dev/{name}".encode(), f"{new}/dev/{name}".encode(), None, _MS_BIND, None,
             what=f"bind /dev/{name}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")


def _mount_work(libc, new: str, cfg: dict) -> None:
    """The code's directory: a tmpfs of its own, as large as its memory, holding the code."""
    uid, gid = cfg["uid"], cfg["gid"]
    work_size = f"mode=0700,uid={uid},gid={gid},size={cfg['memory_mb']}m,nr_inodes=4096".encode()
    libc("mount", b"tandem-work", f"{new}{WORK}".encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, work_size,
         what=f"tmpfs {WORK}")
    with open(SCRIPT, "rb") as src, open(f"{new}{WORK}/{SCRIPT}", "wb") as dst:
        dst.write(src.read())
    os.chown(f"{new}{WORK}/{SCRIPT}", uid, gid)


def _make_read_only(libc, new: str, writable: set) -> None:
    """Remounts every mount under `new` read-only but those in `writable`."""
    for fields in (line.split() for line in read_file("/proc/self/mountinfo").splitlines()):
        target = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
        if (target == new or target.startswith(new + "/")) and target not in writable:
            flags = _MS_NOSUID | _MS_NODEV | sum(_KEPT_FLAGS.get(opt, 0) for opt in fields[5].split(","))
            libc("mount", None, target.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags, None,
                 what=f"read-only {target}")


def _pivot(libc, new: str) -> None:
    os.chdir(new)
    pivot = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if pivot is None:
        raise Failure(f"pivot_root: unknown syscall number on {os.uname().machine}")
    libc("syscall", pivot, b".", b".", what="pivot_root")
    libc("umount2", b".", _MNT_DETACH, what="detach the old root")  # now no path leads outside
    os.chdir(WORK)
    libc("sethostname", b"sandbox", 7)
