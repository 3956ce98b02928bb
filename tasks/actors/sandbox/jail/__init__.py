"""The sandbox's child side: builds the jail, then runs the code in it as its only tenant.

Started by the caller (`../launch.py`) as `python -I -S -c "...import launcher;
launcher.main()" ARGS...` (see `launcher.main` for ARGS) in the run's private directory
(it holds `main.py`, the code), with this directory first on `sys.path`. Imported rather
than run as a script so that its bytecode is cached (compiling it costs ~10 ms). Standard
library only, and little of it (no `ctypes`, `signal` or `select` wrappers: their imports
alone cost milliseconds), because it starts once per run. Three processes, all in
`launcher.py`:

    launcher  new user (when not root), mount, network, PID, IPC and UTS namespaces;
              waits until the caller has moved it into the run's cgroups (GO_FD, when
              there are some), forks the init, reports its pid, waits for it, exits
    init      PID 1 of the new PID namespace: builds the new root (`rootfs.py`: a tmpfs
              holding the read-only system directories, a fresh /proc, a few /dev nodes
              and the /work tmpfs), pivots into it, forks the code, reaps whatever is
              orphaned to it, and bounds the whole tree's CPU time (and, without cgroups,
              its memory) by polling the namespace's /proc. When the code exits, the init
              reports its status and exits, and the kernel kills everything left in the
              namespace before the launcher can see the init gone.
    code      drops to the run's own uid (as root), sets its rlimits and no_new_privs,
              and execs `python -I -S main.py` in /work.

`protocol.py` holds what the caller and the jail agree on (the run directory's layout,
the code's uid, the status lines), `syscalls.py` the libc calls the standard library
lacks and whole-file I/O on plain fds.

The modules import one another by their top-level names (`import protocol`), not as this
package, and are few, because each import is paid on every run: as a package they cost
~0.3 ms more per run, and each further module ~0.1 ms (a run starts in ~30-40 ms). So the
caller imports only `protocol`, which imports nothing of the jail, as
`tasks.actors.sandbox.jail.protocol`. None of them imports the caller's modules, and
none may be named like a standard module: this directory comes first on `sys.path`.
"""
