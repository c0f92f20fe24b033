"""The Django suite runner's virtualenvs see the environment that runs it.

``tests/django/run.py`` makes one virtualenv per Django version.  Made with
``--system-site-packages`` they exposed the *base* interpreter's packages, so
inside a virtualenv nearcache was missing there (or, worse, another checkout's
nearcache was tested).  These tests build a bare virtualenv as the runner does
and check that, with the runner's ``.pth`` file, it imports the very nearcache
this interpreter imports.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import venv
from pathlib import Path
from types import ModuleType

import pytest

import nearcache

RUN_PY = Path(__file__).resolve().parents[2] / "django" / "run.py"


def load_runner() -> ModuleType:
    """Import tests/django/run.py as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("nearcache_django_run", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def imported_from(python: Path, module: str) -> subprocess.CompletedProcess[str]:
    """Run ``python`` to print where ``module`` is imported from."""
    return subprocess.run(
        [str(python), "-c", f"import {module}; print({module}.__file__)"],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )


def test_bare_virtualenv_with_the_pth_imports_this_nearcache(tmp_path: Path) -> None:
    runner = load_runner()
    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"

    pth = runner.write_running_env_pth(python)

    assert pth.name == runner.RUNNING_ENV_PTH
    proc = imported_from(python, "nearcache")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert Path(proc.stdout.strip()).resolve() == Path(nearcache.__file__).resolve()
    assert runner.local_nearcache() == Path(nearcache.__file__).resolve().parent


def test_the_pth_puts_the_virtualenvs_own_packages_first(tmp_path: Path) -> None:
    # A package installed in the Django virtualenv (its pinned Django) must
    # win over the running environment's copy: plant a module named like one
    # the running environment has, and check the virtualenv's is imported.
    runner = load_runner()
    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    pth = runner.write_running_env_pth(python)
    own = pth.parent / "nearcache"
    own.mkdir()
    (own / "__init__.py").write_text("")

    proc = imported_from(python, "nearcache")

    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == (own / "__init__.py").resolve()


def test_environment_tag_names_the_running_environment() -> None:
    runner = load_runner()
    tag = runner.environment_tag()
    assert tag.startswith("env-")
    assert tag == runner.environment_tag()
    assert runner.running_site_dirs()[0].startswith(sys.prefix)


def test_a_version_without_its_python_is_left_out_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = load_runner()

    def no_python(minimum: tuple[int, int]) -> str:
        raise runner.NoInterpreter(f"no Python >= {minimum[0]}.{minimum[1]} found")

    monkeypatch.setattr(runner, "find_python", no_python)
    monkeypatch.delenv("NEARCACHE_DJANGO_ALL", raising=False)
    assert runner.main(["--cache-dir", str(tmp_path)]) == 0
    closing = capsys.readouterr().out.rstrip().splitlines()[-2]
    assert closing.startswith("django-cache-suite: 0 passed, 0 failed, 0 skipped; ")
    assert "Django 6.1.3 not run (needs Python >= 3.12, none installed)" in closing
    # Asked for by name (or with NEARCACHE_DJANGO_ALL=1), it is a failure.
    assert runner.main(["--cache-dir", str(tmp_path), "--django", "6.1.3"]) == 1
    assert "setup failed: no Python >= 3.12" in capsys.readouterr().out
