"""`make test` installs the Debian packages it drives the same way for both: as root, through
sudo when it is there, and otherwise it says what is missing and how to install it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

APT_INSTALL = ROOT / ".ci" / "apt-install"


def stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def run_as_user(tmp_path: Path, *args: str, sudo: bool) -> tuple[subprocess.CompletedProcess[str],
                                                               list[str]]:
    """Run .ci/apt-install as uid 1000 with only stubs on PATH; return it and the calls made."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    log.touch()
    stub(bin_dir, "id", "echo 1000")
    stub(bin_dir, "apt-get", f'echo "apt-get $*" >>{log}')
    if sudo:
        stub(bin_dir, "sudo", f'echo "sudo $*" >>{log}')
    run = subprocess.run(["/bin/bash", str(APT_INSTALL), *args], env={"PATH": str(bin_dir)},
                         capture_output=True, text=True, timeout=60)
    return run, log.read_text().splitlines()


def test_without_root_or_sudo_it_names_the_packages_and_the_command_and_installs_nothing(
        tmp_path: Path) -> None:
    run, calls = run_as_user(tmp_path, "chromium", "fonts-dejavu-core", sudo=False)
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        "missing Debian packages: chromium fonts-dejavu-core",
        "installing them needs root, and sudo is not installed; as root, run:",
        "    apt-get install --no-install-recommends chromium fonts-dejavu-core",
    ]
    assert calls == []


def test_without_root_it_installs_through_sudo(tmp_path: Path) -> None:
    run, calls = run_as_user(tmp_path, "chromium", "fonts-dejavu-core", sudo=True)
    assert (run.returncode, run.stderr) == (0, "")
    assert calls == [
        "sudo apt-get update -qq",
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        "--no-install-recommends chromium fonts-dejavu-core",
    ]


@pytest.mark.parametrize(("script", "install"), [
    ("install-browser", 'bash "$(dirname "$0")/apt-install" chromium fonts-dejavu-core'),
    ("install-pgbouncer", 'bash "$(dirname "$0")/apt-install" --no-service pgbouncer'),
])
def test_both_install_scripts_install_through_the_one_helper(script: str, install: str) -> None:
    text = (ROOT / ".ci" / script).read_text()
    assert install in text.splitlines()
    assert "apt-get" not in text and "id -u" not in text and "sudo" not in text.lower()
