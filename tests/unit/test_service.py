"""`pincer service install`: the systemd units it writes, checked by systemd-analyze where it is available."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.runtime import service


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def test_the_units_run_pincer_restart_on_failure_but_never_on_a_bad_config(config_home: Path) -> None:
    units = service.render(hands=3, system=False, stop_timeout_s=60, config=None)
    stack, hands = units["pincer.service"], units["pincer-hands@.service"]
    assert f"ExecStart={service.pincer_command()} up --hands 3" in stack
    assert f"ExecStart={service.pincer_command()} hands" in hands and "%i" in hands
    assert "ExecReload=/bin/kill -USR1 $MAINPID" in stack  # systemctl reload: the rolling restart
    for unit in units.values():
        assert "Restart=on-failure" in unit and "RestartPreventExitStatus=78" in unit
        assert "KillMode=mixed" in unit and "TimeoutStopSec=60" in unit and "WantedBy=default.target" in unit
        assert f"EnvironmentFile=-{config_home / 'pincer' / 'env'}" in unit
    system = service.render(hands=1, system=True, stop_timeout_s=60, config=Path("/etc/pincer/config.yaml"))
    assert "WantedBy=multi-user.target" in system["pincer.service"]
    local = service.render(hands=2, system=False, stop_timeout_s=60, config=None, local_model=True)
    assert f"ExecStart={service.pincer_command()} up --hands 2 --local-model\n" in local["pincer.service"]
    assert "--config /etc/pincer/config.yaml up --hands 1" in system["pincer.service"]


def test_install_writes_the_units_and_a_private_env_file_and_uninstall_removes_them(
        config_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert service.install(hands=2, system=False, dry_run=True, stop_timeout_s=60, config=None) == 0
    assert "[Service]" in capsys.readouterr().out and not (config_home / "systemd").exists()  # printed only

    assert service.install(hands=2, system=False, dry_run=False, stop_timeout_s=60, config=None) == 0
    where = config_home / "systemd" / "user"
    assert sorted(p.name for p in where.iterdir()) == ["pincer-hands@.service", "pincer.service"]
    secrets = config_home / "pincer" / "env"
    assert secrets.stat().st_mode & 0o777 == 0o600
    said = capsys.readouterr().err
    assert "systemctl --user enable --now pincer" in said and "enable-linger" in said + "lingers"

    if shutil.which("systemd-analyze"):  # systemd's own check of the files, where systemd is installed
        instance = where / "pincer-hands@1.service"
        instance.write_text((where / "pincer-hands@.service").read_text())
        for unit in (where / "pincer.service", instance):
            checked = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
            problems = [line for line in checked.stderr.splitlines() if str(unit.name) in line or "pincer" in line]
            assert checked.returncode == 0 and not problems, checked.stderr
        instance.unlink()

    assert service.uninstall(system=False) == 0
    assert list(where.iterdir()) == [] and secrets.exists()  # the secrets stay



def test_a_system_unit_never_runs_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUDO_USER", raising=False)
    for asked in (None, "root"):
        with pytest.raises(service.UnsafeUnit, match="never root"):
            service.run_as_user(asked)
    with pytest.raises(service.UnsafeUnit, match="no such user"):
        service.run_as_user("no-such-user-here")
    monkeypatch.setenv("SUDO_USER", "nobody")
    assert service.run_as_user(None) == "nobody"
    units = service.render(hands=1, system=True, stop_timeout_s=60, config=None, run_as="nobody")
    assert all("\nUser=nobody\nGroup=" in unit for unit in units.values())


@pytest.mark.skipif(os.geteuid() != 0, reason="making files of another owner needs root")
def test_a_system_unit_refuses_code_someone_else_can_change(tmp_path: Path) -> None:
    venv = tmp_path / "opt" / "pincer"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    for folder in (tmp_path, tmp_path / "opt", venv, venv / "bin"):
        folder.chmod(0o755)
    service.check_code_is_safe("nobody", [python])  # root's, and no one else may write: fine
    (venv / "bin").chmod(0o775)  # its group may write: refused
    with pytest.raises(service.UnsafeUnit, match="writable by its group"):
        service.check_code_is_safe("nobody", [python])
    (venv / "bin").chmod(0o755)
    os.chown(python, 4242, 4242)  # another user's (a venv in someone's home): refused
    with pytest.raises(service.UnsafeUnit, match="belongs to uid 4242"):
        service.check_code_is_safe("nobody", [python])
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(python, nobody, nobody)  # the unit's own user's: it could change it anyway
    service.check_code_is_safe("nobody", [python])


def test_install_system_refuses_before_writing_anything(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("SUDO_USER", raising=False)
    assert service.install(hands=1, system=True, dry_run=False, stop_timeout_s=60, config=None) == 1
    assert "never root" in capsys.readouterr().err
