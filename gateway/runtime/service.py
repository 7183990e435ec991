"""``pincer service install | uninstall``: systemd units that start Pincer at boot and restart it on failure.

Two units: ``pincer.service`` runs the whole stack (``pincer up``), and the
template ``pincer-hands@.service`` runs one more Hands worker per instance
(``systemctl --user start pincer-hands@{1..4}``), on this host or any other
that reaches the same Redis. A bad configuration exits 78, and the units do
not restart on it. Secrets go in an environment file only its owner reads.

System units (``--system``) never run as root: they run as an unprivileged
user (``--run-as``, else the one who ran sudo), and only code that no other
user can change: the interpreter, the installed ``pincer`` and the
environment they live in, and every folder above them, must belong to root
or to that user and be writable by no one else. A venv in someone's home run
as root would hand root to whoever can write to it.
"""

from __future__ import annotations

import getpass
import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from bus.errors import PincerError

UNITS = ("pincer.service", "pincer-hands@.service")


def unit_dir(*, system: bool) -> Path:
    if system:
        return Path("/etc/systemd/system")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "systemd" / "user"


def env_file(*, system: bool) -> Path:
    if system:
        return Path("/etc/pincer/env")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "pincer" / "env"


def pincer_command() -> str:
    """The installed `pincer` beside this interpreter (a venv, pipx, uv tool), else this interpreter's module."""
    beside = Path(sys.executable).parent / "pincer"
    return str(beside) if beside.is_file() else f"{sys.executable} -m gateway"


class UnsafeUnit(PincerError, ValueError):
    """A system unit would run code that someone other than its user could change; the message says what."""


def run_as_user(requested: str | None) -> str:
    """The unprivileged user a system unit runs as: ``requested``, else the one who ran sudo; never root."""
    name = requested or os.environ.get("SUDO_USER") or ""
    if not name or name == "root":
        raise UnsafeUnit("a system unit runs Pincer as an unprivileged user, never root: name one with --run-as USER "
                         "(e.g. a `pincer` user made with `useradd --system --create-home pincer`)")
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise UnsafeUnit(f"--run-as {name}: no such user on this machine") from None
    return name


def check_code_is_safe(user: str, paths: list[Path]) -> None:
    """Refuse when any of ``paths`` (or a folder above one) could be changed by someone other than root and
    ``user``: that someone could then run code as ``user``, or as root had the unit run as root."""
    uid = pwd.getpwnam(user).pw_uid
    seen: set[Path] = set()
    for path in paths:
        for step in [path, *path.parents]:
            if step in seen:
                continue
            seen.add(step)
            info = step.lstat()
            sticky_dir = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
            if info.st_uid not in (0, uid):
                raise UnsafeUnit(f"{step} belongs to uid {info.st_uid}, not root or {user}: install Pincer where only "
                                 f"root or {user} can change it (e.g. `python3 -m venv /opt/pincer` as root)")
            if info.st_mode & 0o022 and not sticky_dir and not stat.S_ISLNK(info.st_mode):
                raise UnsafeUnit(f"{step} is writable by its group or by everyone ({oct(info.st_mode & 0o777)}): "
                                 f"`chmod go-w {step}`, or install Pincer elsewhere")


def installed_code() -> list[Path]:
    """What a unit would run: the interpreter, the `pincer` beside it and the environment both live in."""
    paths = [Path(sys.executable), Path(sys.prefix), Path(sys.executable).resolve()]
    beside = Path(sys.executable).parent / "pincer"
    return [*paths, beside] if beside.is_file() else paths


def render(*, hands: int, system: bool, stop_timeout_s: int, config: Path | None,
           local_model: bool = False, run_as: str | None = None) -> dict[str, str]:
    """The unit files' text, by name (a system unit runs as ``run_as``)."""
    command = pincer_command()
    config_arg = f" --config {config}" if config else ""
    local_arg = " --local-model" if local_model else ""
    target = "multi-user.target" if system else "default.target"
    user = f"User={run_as}\nGroup={grp.getgrgid(pwd.getpwnam(run_as).pw_gid).gr_name}\n" if system and run_as else ""
    service = f"""\
Type=simple
{user}Environment=PYTHONUNBUFFERED=1
EnvironmentFile=-{env_file(system=system)}
Restart=on-failure
RestartSec=5
# 78 (EX_CONFIG): a bad configuration; restarting cannot fix it.
RestartPreventExitStatus=78
# SIGTERM to pincer alone (it drains and stops its children), then SIGKILL to what is left.
KillMode=mixed
TimeoutStopSec={stop_timeout_s}
"""
    return {
        "pincer.service": f"""\
# Written by `pincer service install`; `pincer service uninstall` removes it.
[Unit]
Description=Pincer agent runtime (Gateway, Brain, Hands; embedded Redis unless redis.url is set)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={command}{config_arg} up --hands {hands}{local_arg}
# `systemctl reload pincer`: each process restarted in turn, draining first (`pincer restart --rolling`).
ExecReload=/bin/kill -USR1 $MAINPID
{service}
[Install]
WantedBy={target}
""",
        "pincer-hands@.service": f"""\
# Written by `pincer service install`: one more Hands worker per instance
# (systemctl{'' if system else ' --user'} start pincer-hands@1 pincer-hands@2 ...), joining the pool
# on the Redis that PINCER_REDIS_URL in {env_file(system=system)} names.
[Unit]
Description=Pincer Hands worker %i
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={command}{config_arg} hands
{service}
[Install]
WantedBy={target}
""",
    }


ENV_TEMPLATE = """\
# Environment for Pincer's systemd units (readable by its owner only). What `pincer setup` and
# `pincer channels add` saved is in <data dir>/secrets.env, which pincer reads itself; a line here wins.
# PINCER_MODEL=openai/gpt-4o-mini
# OPENAI_API_KEY=sk-...
# PINCER_REDIS_URL=redis://:password@redis-host:6379/0   (needed by pincer-hands@ on other hosts)
# PINCER_GATEWAY_TOKEN=...
"""


def install(*, hands: int, system: bool, dry_run: bool, stop_timeout_s: int, config: Path | None,
            local_model: bool = False, run_as: str | None = None) -> int:
    user = None
    if system:
        try:
            user = run_as_user(run_as)
            check_code_is_safe(user, installed_code() + ([config] if config else []))
        except UnsafeUnit as exc:
            print(f"pincer: error: {exc}", file=sys.stderr)
            return 1
    units = render(hands=hands, system=system, stop_timeout_s=stop_timeout_s, config=config, local_model=local_model,
                   run_as=user)
    where = unit_dir(system=system)
    if dry_run:
        for name, text in units.items():
            print(f"# {where / name}\n{text}")
        return 0
    if system and os.geteuid() != 0:
        print("pincer: error: --system writes to /etc/systemd/system: run it as root (sudo)", file=sys.stderr)
        return 1
    where.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():
        (where / name).write_text(text)
    secrets = env_file(system=system)
    if not secrets.exists():
        secrets.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(ENV_TEMPLATE)
    scope = [] if system else ["--user"]
    print(f"wrote {', '.join(str(where / n) for n in units)}; secrets go in {secrets}", file=sys.stderr)
    _systemctl(*scope, "daemon-reload")
    print(f"start it now and at boot: systemctl {' '.join([*scope, 'enable', '--now', 'pincer'])}", file=sys.stderr)
    if not system:
        print(_linger_advice(), file=sys.stderr)
    return 0


def uninstall(*, system: bool) -> int:
    where = unit_dir(system=system)
    scope = [] if system else ["--user"]
    present = [where / name for name in UNITS if (where / name).exists()]
    if not present:
        print(f"no Pincer units in {where}", file=sys.stderr)
        return 0
    _systemctl(*scope, "disable", "--now", "pincer.service")
    for path in present:
        path.unlink()
    _systemctl(*scope, "daemon-reload")
    print(f"removed {', '.join(map(str, present))} (the environment file {env_file(system=system)} is kept)",
          file=sys.stderr)
    return 0


def _systemctl(*args: str) -> bool:
    """Run systemctl if this machine has a running systemd; say so when it has none."""
    if shutil.which("systemctl") is None:
        print("(no systemctl here: load the units on a machine that runs systemd)", file=sys.stderr)
        return False
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        print(f"(systemctl {' '.join(args)}: {done.stderr.strip() or done.returncode})", file=sys.stderr)
    return done.returncode == 0


def _linger_advice() -> str:
    """A user unit starts at boot only if the user lingers; say how when they do not."""
    user = getpass.getuser()
    try:
        found = subprocess.run(["loginctl", "show-user", user, "--property=Linger"], capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        found = None
    if found is not None and found.stdout.strip() == "Linger=yes":
        return f"{user} lingers: the unit starts at boot, before anyone logs in"
    return (f"to start it at boot before {user} logs in: sudo loginctl enable-linger {user}"
            + ("" if found is not None and found.returncode == 0 else " (could not check: no logind here)"))
