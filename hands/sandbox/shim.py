"""The landlock tier's launcher: isolate this process, then exec the command.

Self-contained on purpose (standard library only): the worker runs it as the
sandbox uid with ``python3 -I -c <this file's text> WORKSPACE WORKDIR BPF_FD --
ARGV...``, so the sandbox uid needs no access to Pincer's own files. It enters
new user, network (no interfaces: no network), pid and mount namespaces (its
child is pid 1 there and dies with the launcher, taking every descendant,
even a setsid one, with it; a /proc of its own shows only those), confines files
with Landlock (read-only system trees, read-write workspace; TCP bind/connect
denied on ABI 4+), installs the seccomp program the worker compiled, and
execs. Any failed step stops it with exit code 126.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS = 0x10000000, 0x40000000, 0x20000000, 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 4, 22, 2
READ_ONLY_PATHS = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl",
             "/etc/ca-certificates", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
             "/etc/hosts", "/etc/mime.types", "/dev/zero", "/dev/urandom", "/proc"]

SYS_CREATE, SYS_ADD_RULE, SYS_RESTRICT = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The Landlock ABI version of this kernel; 0 when Landlock is off or missing."""
    version = _libc.syscall(SYS_CREATE, None, 0, CREATE_RULESET_VERSION)
    return max(int(version), 0)


def restrict(*, read_only: list[str], writable: list[str]) -> int:
    """Confine this process (and what it execs) to the given trees; returns the ABI used."""
    version = abi()
    if version == 0:
        raise OSError("Landlock is not available on this kernel")
    handled = FS_BY_ABI.get(version, FS_BY_ABI[5])
    attr = _RulesetAttr(handled_access_fs=handled, handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP)
                        if version >= 4 else 0)
    size = ctypes.sizeof(attr) if version >= 4 else ctypes.sizeof(ctypes.c_uint64)
    ruleset = _libc.syscall(SYS_CREATE, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, access in ((read_only, READ_RIGHTS), (writable, handled)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # absent on this machine: nothing to grant
                try:
                    # Files (not directories) may only get file rights.
                    rights = access if os.path.isdir(path) else access & (EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE)
                    rule = _PathBeneath(allowed_access=rights & handled, parent_fd=fd)
                    if _libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0) < 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
                finally:
                    os.close(fd)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if _libc.syscall(SYS_RESTRICT, ruleset, 0) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return version


def main(args: list[str]) -> None:
    workspace, workdir, seccomp_fd, *rest = args
    if "--" not in rest or rest.index("--") == len(rest) - 1:
        _fail("usage: shim WORKSPACE WORKDIR BPF_FD [READABLE_DIR...] -- ARGV...")
    readable, argv = rest[:rest.index("--")], rest[rest.index("--") + 1:]
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # setpriv cleared it; the new user namespace needs it
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS) != 0:
        _fail(f"unshare failed: {os.strerror(ctypes.get_errno())}")
    child = os.fork()  # the first child is pid 1 of the new pid namespace
    if child:
        _supervise(child)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # launcher killed: pid 1 dies, and all below it
    # A /proc of the new pid namespace: the host's processes (their command lines, environments) unseen.
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0 or \
            _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        _fail(f"cannot mount a /proc of its own: {os.strerror(ctypes.get_errno())}")
    tmp = os.path.join(workspace, ".tmp")
    os.makedirs(tmp, exist_ok=True)
    try:
        restrict(read_only=[*READ_ONLY_PATHS, *readable], writable=[workspace, "/dev/null"])
    except OSError as exc:
        _fail(str(exc))
    _load_seccomp(int(seccomp_fd))
    os.environ["TMPDIR"] = tmp
    os.chdir(os.path.join(workspace, workdir))
    for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores these, and exec would pass that on
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, os.environ)
    except OSError as exc:
        _fail(f"cannot run {argv[0]!r}: {exc.strerror}", code=127)


def _supervise(child: int) -> None:
    """The launcher outside the namespace: pass signals on, then end the way the command ended."""
    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            # pid 1 ignores signals it has no handler for; SIGKILL is the one that always works.
            os.kill(child, signal.SIGKILL if sig in (signal.SIGTERM, signal.SIGINT) else sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 126)


def _load_seccomp(fd: int) -> None:
    """Install the BPF program the worker compiled (the one bwrap gets in the bwrap tier)."""
    program = os.read(fd, 1 << 20)
    os.close(fd)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len=len(program) // 8, filter=ctypes.cast(buffer, ctypes.c_void_p))
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        _fail(f"seccomp failed: {os.strerror(ctypes.get_errno())}")


def _fail(message: str, code: int = 126) -> None:
    print(f"pincer sandbox: {message}", file=sys.stderr)
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
