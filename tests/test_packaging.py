"""What a built distribution carries: the sdist and the wheel that `python -m build` makes."""

from __future__ import annotations

import os
import shlex
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


def readme_block(after: str, language: str) -> str:
    """The first ```language block of the README after the text ``after``."""
    text = (ROOT / "README.md").read_text()
    rest = text[text.index(after):]
    return rest.split(f"```{language}\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_readme_install_path_runs_a_first_job_in_a_fresh_project(
        dist: Path, tmp_path: Path) -> None:
    from django.db import connection

    database = "pgjobs_readme_first_job"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        cursor.execute(f"CREATE DATABASE {database}")
    try:
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        bin_dir = venv / "bin"
        # The new project's own environment: nothing of the test project's settings or virtualenv
        # (pip's own settings, such as an index or a proxy, stay).
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("DJANGO_", "PGJOBS_", "DATABASE_URL", "VIRTUAL_ENV",
                                       "PYTHON"))}
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"

        def run(*command: str, cwd: Path = tmp_path) -> str:
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            return done.stdout + done.stderr

        # The README's wheel, installed into a fresh virtualenv.
        [wheel] = dist.glob("django_pgjobs-*.whl")
        assert f"pip install dist/{wheel.name}" in readme_block("## Install", "sh")
        run(str(bin_dir / "pip"), "install", "--quiet", str(wheel))

        run(str(bin_dir / "django-admin"), "startproject", "mysite")
        project = tmp_path / "mysite"
        run(str(bin_dir / "python"), "manage.py", "startapp", "greetings", cwd=project)
        db = connection.settings_dict
        settings = project / "mysite" / "settings.py"
        configured = readme_block("## Configure", "python").replace(
            "    # ...\n", "").replace("INSTALLED_APPS = [", "INSTALLED_APPS += [")
        assert '"ENGINE": "django.db.backends.postgresql"' in configured
        configured = (configured.replace('"mysite"', repr(database))
                      .replace('"postgres"', repr(db["USER"]))
                      .replace('"127.0.0.1"', repr(db["HOST"]))
                      .replace('"5432"', repr(str(db["PORT"] or 5432))))
        settings.write_text(settings.read_text()
                            + f"\n{configured}\nINSTALLED_APPS += ['greetings']\n")
        handler = readme_block("## A first job", "python")
        (project / "greetings" / "jobs.py").write_text(handler)

        run(str(bin_dir / "python"), "manage.py", "migrate", cwd=project)
        enqueue, work = readme_block("Enqueue one", "sh").splitlines()
        python = str(bin_dir / "python")
        run(*shlex.split(enqueue.replace("python", python, 1)), cwd=project)
        output = run(*shlex.split(work.replace("python", python, 1)), cwd=project)
        assert "claimed 1, settled 1 {'succeeded': 1}, lost 0" in output
        jobs = run(python, "manage.py", "shell", "-c", "from django_pgjobs.models import Job; "
                   "print([(j.task, j.status, j.result) for j in Job.objects.all()])",
                   cwd=project)
        assert "[('greetings.hello', 'succeeded', 'hello, world')]" in jobs
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
