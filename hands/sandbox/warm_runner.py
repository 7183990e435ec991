"""A warm sandbox's runner: inside one bwrap, run the commands the worker sends, one at a time.

Self-contained on purpose (standard library only): the worker starts it as
``python3 -I -c <this file's text> FD`` in place of a command, with the same
bwrap arguments, rlimits, uid, cgroup and seccomp filter as a cold command, so
every command it forks inherits all of them. FD is one end of a SOCK_SEQPACKET
socketpair; each message is one JSON object:

- worker -> runner: ``{"argv": [...], "env": {...}, "cwd": "/workspace/..."}``
  with three descriptors attached (the command's stdin, stdout, stderr);
  ``{"kill": true}`` stops the command running now.
- runner -> worker: ``{"exit": CODE}`` (negative: the signal that ended it)
  once it ended and every process it left behind is gone (1, with a line on
  its stderr, when it could not be started).

A command runs in a session (and process group) of its own, with the default
signal dispositions, in its working directory and with exactly the
environment sent (its PATH is where the program is looked for). When it
ends, or is killed (SIGTERM to its group, a grace, then SIGKILL), every other
process of the sandbox but bwrap's init and this runner is killed
(``kill(-1)`` reaches only this pid namespace): as with a cold command,
nothing a command started outlives it. EOF on FD ends the
runner, and with it (bwrap's init follows its child) the sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

GRACE_S = 3.0
PR_SET_DUMPABLE = 4
SWEEP_S = 2.0
# What Python sets aside for itself (ignored SIGPIPE and SIGXFSZ) a command gets back, as from bwrap.
DEFAULTED = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM)


def sweep() -> bool:
    """SIGKILL every process of this pid namespace but init and us, until none is left to signal; False
    when some still were after ``SWEEP_S``."""
    deadline = time.monotonic() + SWEEP_S
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.001)
    return False


def spawn(request: dict[str, Any], fds: list[int]) -> int | None:
    """Start the command in a session of its own (posix_spawn: a vfork, several times cheaper than a fork of
    this interpreter); None when it could not be started, said on its stderr as bwrap would."""
    env = request["env"]
    os.environ["PATH"] = env.get("PATH", os.defpath)  # where posix_spawnp looks, as bwrap's execvp would
    try:
        os.chdir(request["cwd"])
        return os.posix_spawnp(request["argv"][0], request["argv"], env, setsid=True, setsigdef=DEFAULTED,
                               file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)])
    except OSError as exc:
        os.write(fds[2], f"warm runner: execvp {request['argv'][0]}: {exc.strerror}\n".encode(errors="replace"))
        return None


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def run(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    pid = spawn(request, fds)
    for fd in fds:
        os.close(fd)
    if pid is None:
        send(sock, {"exit": 1})
        return
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sock.fileno(), select.POLLIN)
    killing_since = None
    while True:
        timeout = None if killing_since is None else max(0.0, GRACE_S - (time.monotonic() - killing_since)) * 1000
        ready = {fd for fd, _ in poller.poll(timeout)}
        if pidfd in ready:
            break
        if sock.fileno() in ready:
            data = sock.recv(65536)
            if not data:  # the worker is gone: so is everything here
                os.killpg(pid, signal.SIGKILL)
                sys.exit(0)
            if json.loads(data).get("kill") and killing_since is None:
                killing_since = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
        elif killing_since is not None:  # the grace is over
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            poller.unregister(sock.fileno())
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    clean = sweep()
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    send(sock, {"exit": code})
    if not clean:  # something outlived the command: the sandbox ends (bwrap's init follows us), not reused
        sys.exit(1)


def main() -> None:
    with open("/proc/1/comm") as init:  # kill(-1) must reach this sandbox's pid namespace only
        if init.read().strip() != "bwrap":
            sys.exit("warm runner: not inside bubblewrap's pid namespace; refusing to run")
    # Not dumpable: the commands (the same uid) cannot open its memory through /proc and take it over. Each
    # command is dumpable again from its exec on.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)  # never a command's
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    while True:
        data, fds, _, _ = socket.recv_fds(sock, 2 << 20, 3)  # the worker sends at most 1 MiB
        if not data:
            return
        for fd in fds:
            os.set_inheritable(fd, False)  # only as the command's 0, 1 and 2
        request = json.loads(data)
        if "argv" not in request or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue  # a kill for a command already ended
        run(sock, request, fds)


if __name__ == "__main__":
    main()
