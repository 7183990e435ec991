"""The seccomp filter every sandboxed command runs under, as a BPF program in a memfd for bwrap."""

from __future__ import annotations

import errno
import os
import socket

# Syscalls a tool's command never needs, each of them a known way out of a sandbox.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "open_by_handle_at", "name_to_handle_at", "swapon", "swapoff", "reboot", "acct",
)


# The landlock tier shares the host's file system (Landlock limits opening files, not these): no
# socket of any family (a pathname UNIX socket outside the workspace, ssh-agent or D-Bus or a
# Docker socket, is one connect away; socketpair still works), and no changing the mode, owner or
# times of a file by its path (Landlock does not cover them; by descriptor, the open was checked).
LANDLOCK_DENIED = ("chmod", "fchmodat", "fchmodat2", "chown", "lchown", "fchownat", "utime", "utimes",
                   "futimesat")


def bpf_fd(*, tier: str = "bwrap", network: bool = False) -> int:
    """A file descriptor holding the compiled filter (bwrap ``--seccomp FD`` reads it)."""
    import pyseccomp as sc  # ctypes over the system's libseccomp

    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    denied: tuple[str, ...]
    if tier == "landlock":
        flt.add_rule(sc.ERRNO(errno.EPERM), "socket")
        flt.add_rule(sc.ERRNO(errno.EPERM), "utimensat", sc.Arg(1, sc.NE, 0))  # a path, not a descriptor
        denied = (*DENIED, *LANDLOCK_DENIED)
    else:  # bwrap: only AF_UNIX (no network, no AF_VSOCK to the VM's host); no host socket is mounted
        if network:  # a program whose entry allows the network: IP sockets too, still no VSOCK, netlink, ...
            for family in (socket.AF_VSOCK, socket.AF_NETLINK, socket.AF_PACKET):
                flt.add_rule(sc.ERRNO(errno.EPERM), "socket", sc.Arg(0, sc.EQ, family))
        else:
            flt.add_rule(sc.ERRNO(errno.EPERM), "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
        denied = DENIED
    for name in denied:
        try:
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):
            continue  # a syscall this kernel or libseccomp does not know
    fd = os.memfd_create("pincer-seccomp", 0)
    with os.fdopen(os.dup(fd), "wb") as out:
        flt.export_bpf(out)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
