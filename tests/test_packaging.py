"""What a built distribution carries: the sdist and the wheel that `python -m build` makes."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    return out


@pytest.mark.slow
def test_the_sdist_and_the_wheel_carry_the_license(dist: Path) -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("BSD 3-Clause License\n")
    assert "Copyright (c) the django-pgjobs authors." in license_text

    [sdist] = dist.glob("django_pgjobs-*.tar.gz")
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"{sdist.name[:-len('.tar.gz')]}/LICENSE")
        assert member is not None and member.read().decode() == license_text

    [wheel] = dist.glob("django_pgjobs-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = wheel.name.split("-py3")[0] + ".dist-info"
        assert archive.read(f"{info}/licenses/LICENSE").decode() == license_text
        metadata = archive.read(f"{info}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause\n" in metadata
    assert "License-File: LICENSE\n" in metadata
