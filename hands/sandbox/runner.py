"""Run one command in the sandbox tier this machine allows, and always clean up after it.

Tiers, best first (chosen once per worker, reported in every result):

- ``bwrap``: bubblewrap started as an unprivileged uid (root launching bwrap
  would stay host root inside), an allowlisted read-only root, the workspace
  read-write at /workspace, tmpfs /tmp, every namespace unshared, no
  capabilities, a cleared environment and the seccomp filter of ``seccomp.py``.
- ``landlock``: where bubblewrap is not usable, a small shim confines the
  command with Landlock (writes to the workspace and /tmp only, reads of an
  allowlist), new namespaces and the same seccomp filter.
- ``rlimits``: no isolation beyond the unprivileged uid and the limits; only
  used when ``hands.sandbox.allow_degraded`` says so.

Which one a machine gives is decided once per worker (``tiers.choose_tier``).

Every tier: rlimits via ``prlimit`` (address space, CPU, file size, open files,
processes, no core dumps), its own session, bounded output capture, and on
timeout or cancellation the whole tree dies (SIGTERM, grace, SIGKILL; bwrap's
pid namespace takes every descendant with it). A started command is a
``running.Running``; in the bwrap tier a tool's command goes to its session's
warm sandbox (``warm.py``) unless ``hands.sandbox.warm`` is off.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bus.errors import PincerError
from bus.metrics import Meter
from bus.workspace import Shared, Workspace
from hands.config import SandboxSettings
from hands.sandbox.cgroup import RunCgroup
from hands.sandbox.running import Running, RunResult, run_to_end
from hands.sandbox.shim import READ_ONLY_PATHS
from hands.sandbox.tiers import Tier, choose_tier, seccomp_fd, shim
from hands.sandbox.warm import RUNNER_SOURCE, WarmKey, WarmPool

# The /etc files a command may read, in every tier: the shim's list (it runs standalone) is the one home.
ETC_FILES = tuple(p.removeprefix("/etc/") for p in READ_ONLY_PATHS if p.startswith("/etc/"))


@dataclass(frozen=True)
class Extras:
    """What a long-lived program (an MCP server) gets beyond a tool's command: its own install
    directories read-only, the network if its entry allows it, and limits of its own."""

    read_only: tuple[Path, ...] = ()
    network: bool = False
    workspace: Literal["rw", "ro", "none"] = "rw"  # how the workspace is mounted (bwrap; landlock: rw only)
    limits: SandboxSettings | None = None
    line_bytes: int = 2**16  # the longest stdout line the caller's readline takes (asyncio's default)


SYSTEM_PYTHON = "/usr/bin/python3"  # the warm runner's interpreter: under /usr, so inside every bwrap sandbox
NPROC_BACKSTOP_FACTOR = 16  # commands of one machine at once, each under its own pids.max


class SandboxUnavailable(PincerError):
    """No tier this machine offers is allowed by the configuration; the message says how to fix it."""


class Sandbox:
    def __init__(self, settings: SandboxSettings, workspace: Path, *, meter: Meter | None = None) -> None:
        self.settings, self.workspace = settings, workspace
        self.as_root = os.geteuid() == 0
        self.tier = choose_tier(settings, as_root=self.as_root)
        self.meter = meter or Meter()
        self.session_caps = RunCgroup.usable(settings.cgroup_dir)  # each session's processes capped apart
        # bwrap only: the runner's sweep of what a command left relies on a pid namespace of its own.
        self.warm = WarmPool(self._launch_warm, idle_s=settings.warm_idle_s, most=settings.warm_max) \
            if settings.warm and self.tier is Tier.BWRAP and os.access(SYSTEM_PYTHON, os.X_OK) else None

    async def close(self) -> None:
        """Tear down every warm sandbox (the worker's shutdown)."""
        if self.warm is not None:
            await self.warm.close()

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who must own workspace files for sandboxed commands to write them (when we are root)."""
        return (self.settings.uid, self.settings.gid) if self.as_root else None

    def check_allowed(self, root: Path | None = None) -> None:
        blocked = self._unreachable_dir(root or self.workspace)
        if blocked is not None:
            raise SandboxUnavailable(
                f"commands run as uid {self.settings.uid}, which cannot enter {blocked} on the way to the workspace "
                f"{root or self.workspace}; move the workspace somewhere it can reach (hands.workspace / "
                "PINCER_WORKSPACE, hands.identity_workspaces)"
            )
        if self.tier is Tier.RLIMITS and not self.settings.allow_degraded:
            raise SandboxUnavailable(
                "code execution is off: bubblewrap is not usable here, and running commands with rlimits only is "
                "not allowed. Install it (apt-get install bubblewrap) or set hands.sandbox.allow_degraded: true"
            )
        if not self.session_caps and not self.settings.allow_shared_process_limit:
            raise SandboxUnavailable(
                "code execution is off: no session's processes can be capped apart here (no pids cgroup: "
                + ("hands.sandbox.cgroup_dir does not give one" if self.settings.cgroup_dir else
                   "Pincer is not root" if not self.as_root else "the kernel offers no pids controller")
                + "), so one session's fork storm would leave every other unable to run a command. Run Hands as "
                "root (commands still run as an unprivileged uid), or delegate a cgroup folder with the pids "
                "controller to Pincer's user and name it in hands.sandbox.cgroup_dir, or accept one shared "
                "limit: hands.sandbox.allow_shared_process_limit: true"
            )

    async def run(self, argv: list[str], *, workdir: str, env: dict[str, str], timeout_s: float,
                  stdin: bytes | None = None, session: str = "", root: Path | None = None) -> RunResult:
        """Run to the end (or the timeout, which kills the whole tree)."""
        return await run_to_end(await self.start(argv, workdir=workdir, env=env, session=session, root=root),
                                timeout_s=timeout_s, stdin=stdin)

    async def start(self, argv: list[str], *, workdir: str, env: dict[str, str], extra: Extras | None = None,
                    capture_stdout: bool = True, session: str = "", root: Path | None = None,
                    shared: dict[str, Shared] | None = None) -> Running:
        """Start a command of ``session`` in the workspace ``root`` (the call's identity's; default the
        worker's) and return its handle; the caller must ``stop()`` it (it may be long gone). The session's
        commands together hold at most ``session_processes``. ``shared``: folders shown in that workspace
        under their names (bubblewrap mounts them there, read-only unless writable; the landlock tier lets
        the command read them at their own paths)."""
        root = root or self.workspace
        self.check_allowed(root)
        if self.warm is not None and extra is None:  # a tool's command: a warm sandbox of its session
            running = await self._start_warm(argv, root=root, workdir=workdir, env=env, session=session,
                                             shared=shared or {})
            if running is not None:
                return running  # else every warm sandbox is busy: this one runs cold
        extra = extra or Extras()
        if extra.network and self.tier is Tier.LANDLOCK:
            raise SandboxUnavailable("the landlock tier cannot give a command the network (it has no network "
                                     "namespace to share); install bubblewrap, or do without network")
        if extra.workspace != "rw" and self.tier is Tier.LANDLOCK:
            raise SandboxUnavailable(f"the landlock tier always gives the workspace read-write, not "
                                     f"{extra.workspace!r}; install bubblewrap for that")
        limits = extra.limits or self.settings
        seccomp = seccomp_fd(self.tier, network=extra.network) if self.tier is not Tier.RLIMITS else None
        cgroup = RunCgroup.create(session=session, memory_mb=limits.memory_mb, pids_max=limits.processes,
                                  session_pids_max=self.settings.session_processes, delegated=self.settings.cgroup_dir)
        command = self._command(argv, root=root, workdir=workdir, env=env, seccomp_fd=seccomp, extra=extra,
                                tree_capped=cgroup is not None and cgroup.caps_processes, shared=shared or {})
        if cgroup is not None:
            command = cgroup.wrap(command)
        spawning = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, pass_fds=(seccomp,) if seccomp is not None else (), limit=extra.line_bytes,
                env={"PATH": "/usr/bin:/bin"} if self.tier is Tier.BWRAP else env,
                cwd=root / workdir if self.tier is Tier.RLIMITS else None,
            )
        finally:
            if seccomp is not None:
                os.close(seccomp)
        self.meter.observe("pincer_sandbox_spawn_seconds", time.monotonic() - spawning, self.tier)
        return Running(process, self.tier, limits.output_bytes, cgroup=cgroup, capture_stdout=capture_stdout)

    async def _start_warm(self, argv: list[str], *, root: Path, workdir: str, env: dict[str, str], session: str,
                          shared: dict[str, Shared]) -> Running | None:
        assert self.warm is not None
        key = WarmKey(session, root, tuple(sorted((name, str(f.tree.root), f.writable) for name, f in shared.items())))
        spawning = time.monotonic()
        process = await self.warm.run(key, argv, env=env, cwd=_in_sandbox(workdir), line_bytes=Extras().line_bytes)
        if process is None:
            return None
        self.meter.observe("pincer_sandbox_spawn_seconds", time.monotonic() - spawning, "bwrap-warm")
        return Running(process, self.tier, self.settings.output_bytes, kill_tree=process.kill_tree)

    async def _launch_warm(self, key: WarmKey, control_fd: int) -> tuple[asyncio.subprocess.Process,
                                                                          RunCgroup | None]:
        """Start a warm sandbox for ``key``: a cold command's chain and cgroup, its runner in the command's place."""
        shared = {name: Shared(tree=Workspace(Path(tree)), writable=writable) for name, tree, writable in key.shared}
        seccomp = seccomp_fd(self.tier)
        cgroup = RunCgroup.create(session=key.session, memory_mb=self.settings.memory_mb,
                                  pids_max=self.settings.processes, session_pids_max=self.settings.session_processes,
                                  delegated=self.settings.cgroup_dir)
        command = self._command([SYSTEM_PYTHON, "-I", "-c", RUNNER_SOURCE, str(control_fd)], root=key.root, workdir="",
                                env={}, seccomp_fd=seccomp, extra=Extras(), shared=shared,
                                tree_capped=cgroup is not None and cgroup.caps_processes)
        if cgroup is not None:
            command = cgroup.wrap(command)
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(seccomp, control_fd), env={"PATH": "/usr/bin:/bin"})
        finally:
            os.close(seccomp)
        return process, cgroup

    def _unreachable_dir(self, root: Path) -> Path | None:
        """The first directory on the workspace's path the sandbox uid may not pass through, if any."""
        if not self.as_root:
            return None  # commands run as we do
        uid, gid = self.settings.uid, self.settings.gid
        for directory in [root, *root.parents]:
            info = directory.stat()
            bit = 0o100 if info.st_uid == uid else 0o010 if info.st_gid == gid else 0o001
            if not info.st_mode & bit:
                return directory
        return None

    def _command(self, argv: list[str], *, root: Path, workdir: str, env: dict[str, str], seccomp_fd: int | None,
                 extra: Extras, tree_capped: bool = False, shared: dict[str, Shared] | None = None) -> list[str]:
        s = extra.limits or self.settings
        # RLIMIT_NPROC counts every process of the sandbox uid on the machine: alone it lets one command's
        # fork bomb starve all the others, so where a pids cgroup caps each tree it is only a backstop.
        nproc = s.processes * NPROC_BACKSTOP_FACTOR if tree_capped else s.processes
        limits = ["prlimit", f"--as={s.memory_mb * 1024 * 1024}", f"--cpu={s.cpu_s}:{s.cpu_s + 1}",
                  f"--fsize={s.file_size_mb * 1024 * 1024}", f"--nofile={s.open_files}", f"--nproc={nproc}",
                  "--core=0", "--"]
        drop = ["setpriv", f"--reuid={s.uid}", f"--regid={s.gid}", "--clear-groups", "--inh-caps=-all"] \
            if self.as_root else []
        if self.tier is Tier.RLIMITS:
            return [*limits, *drop, *argv]
        if self.tier is Tier.LANDLOCK:
            readable = [str(p) for p in [*extra.read_only, *(f.tree.root for f in (shared or {}).values())]]
            return [*limits, *drop, *shim(), str(root), workdir or ".", str(seccomp_fd), *readable, "--",
                    *argv]
        return [*limits, *drop, *self._bwrap(root, workdir, env, seccomp_fd, extra, shared or {}), "--", *argv]

    def _bwrap(self, root: Path, workdir: str, env: dict[str, str], seccomp_fd: int | None, extra: Extras,
               shared: dict[str, Shared]) -> list[str]:
        args = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--hostname", "sandbox",
                "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
        if extra.network:  # the host's network and its resolver (no other tool gets either)
            args += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        for name, value in env.items():
            args += ["--setenv", name, value]
        args += ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            if Path(f"/usr/{link}").exists():
                args += ["--symlink", f"usr/{link}", f"/{link}"]
        for name in ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(64 * 1024 * 1024), "--tmpfs", "/tmp"]
        if extra.workspace != "none":
            args += ["--bind" if extra.workspace == "rw" else "--ro-bind", str(root), "/workspace"]
            for name, folder in shared.items():  # over the tree's own (empty) folder of that name
                writable = folder.writable and extra.workspace == "rw"
                args += ["--bind" if writable else "--ro-bind", str(folder.tree.root), f"/workspace/{name}"]
        for path in extra.read_only:  # at the same path, so a program's own absolute paths still hold
            args += ["--ro-bind", str(path), str(path)]
        args += ["--remount-ro", "/",
                 "--chdir", "/tmp" if extra.workspace == "none" else _in_sandbox(workdir)]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return args


def _in_sandbox(workdir: str) -> str:
    """Where a workspace-relative working directory is inside bwrap."""
    return f"/workspace/{workdir}".rstrip("/").replace("/./", "/") or "/workspace"
