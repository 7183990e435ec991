"""`pincer service install`: the systemd units it writes, checked by systemd-analyze where it is available."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gateway import service


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def test_the_units_run_pincer_restart_on_failure_but_never_on_a_bad_config(config_home: Path) -> None:
    units = service.render(hands=3, system=False, stop_timeout_s=60, config=None)
    stack, hands = units["pincer.service"], units["pincer-hands@.service"]
    assert f"ExecStart={service.pincer_command()} up --hands 3" in stack
    assert f"ExecStart={service.pincer_command()} hands" in hands and "%i" in hands
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

