"""The wheel is the library: built from the checkout, it holds the package ``headroom`` and
nothing else at top level (the folders mapped into it once each, the broker files and the shipped
scenarios with their traces as package data), and installed alone into a fresh virtual
environment it runs a shipped scenario from an empty directory.

Fast and offline: the sdist and the wheel are built with the dev environment's setuptools
(``python -m build --no-isolation``, no download), the fresh environment gets the wheel only
(``pip install --no-deps``), and the runtime dependencies come from the dev environment's
site-packages through ``PYTHONPATH`` — a plain path entry, whose ``.pth`` files Python does not
process, so the checkout's editable install stays invisible (asserted: ``headroom.__file__`` lies
in the fresh environment).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# top-level folders of the checkout that pyproject maps into the namespace (package-dir)
MAPPED = (
    "kernel",
    "world",
    "defences",
    "controllers",
    "streams",
    "workers",
    "sim",
    "analysis",
    "bench",
    "scenarios",
)
BROKER_FILES = ("headroom/broker/pom.xml", "headroom/broker/log4j2.properties")


def _run(
    args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _copy_checkout(dest: Path) -> None:
    """The files of the working tree that git tracks or would track (no .venv, caches, runs or
    downloaded broker jars), symlinks kept as symlinks — what a fresh clone plus local edits
    holds."""
    listing = _run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    )
    for name in sorted(set(filter(None, listing.stdout.split("\0")))):
        src = REPO / name
        if not os.path.lexists(src):  # deleted in the working tree, not yet in the index
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the copied checkout, the sdist built from it, the wheel built from that sdist)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    _copy_checkout(src)
    assert (src / "headroom" / "kernel").is_symlink()  # the tree as the checkout has it
    out = root / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)])
    (sdist,) = out.glob("headroom-*.tar.gz")
    (wheel,) = out.glob("headroom-*.whl")
    return src, sdist, wheel


def test_the_wheel_holds_the_package_headroom_and_nothing_else(
    dists: tuple[Path, Path, Path],
) -> None:
    src, _sdist, wheel = dists
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        (record_name,) = [n for n in names if n.endswith(".dist-info/RECORD")]
        record = [line.split(",")[0] for line in z.read(record_name).decode().splitlines()]
    assert sorted(record) == sorted(names)  # RECORD lists exactly what the wheel holds
    dist_info = record_name.split("/")[0]
    assert dist_info.startswith("headroom-")
    assert dist_info.endswith(".dist-info")
    assert {n.split("/")[0] for n in names} == {"headroom", dist_info}
    doubled = [n for n, k in Counter(names).items() if k > 1]
    assert doubled == []
    # a symlinked folder is there once, under its package name, never through the link again
    assert [n for n in names if n.startswith("headroom/headroom/")] == []
    for folder in MAPPED:
        want = sorted(
            str(p.relative_to(src)) for p in (src / folder).rglob("*") if p.suffix == ".py"
        )
        have = sorted(
            n.removeprefix("headroom/")
            for n in names
            if n.startswith(f"headroom/{folder}/") and n.endswith(".py")
        )
        assert have == want, folder
        for name in names:
            parts = name.split("/")
            assert parts.count(folder) <= 1, name
    for name in BROKER_FILES:
        assert name in names
    assert [n for n in names if n.startswith("headroom/broker/") and n not in BROKER_FILES] == []
    shipped = {p.name for p in (src / "scenarios").glob("*.yaml")}
    traces = {p.name for p in (src / "scenarios" / "traces").glob("*.csv")}
    assert shipped
    assert traces
    assert {n.split("/")[-1] for n in names if n.startswith("headroom/scenarios/")} == (
        shipped | traces
    )
    assert {n for n in names if n.startswith("headroom/scenarios/traces/")} == {
        f"headroom/scenarios/traces/{t}" for t in traces
    }


def test_the_sdist_holds_the_broker_files_and_no_symlinks(
    dists: tuple[Path, Path, Path],
) -> None:
    _src, sdist, _wheel = dists
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
    assert [m.name for m in members if m.issym() or m.islnk()] == []
    top = members[0].name.split("/")[0]
    names = [m.name.removeprefix(f"{top}/") for m in members if m.isfile()]
    assert [n for n, k in Counter(names).items() if k > 1] == []
    for name in BROKER_FILES:
        assert name in names
    assert [n for n in names if n.startswith("headroom/broker/libs")] == []
    # the mapped folders come in as themselves, not a second time through headroom/<folder>
    assert [n for n in names if n.split("/")[0] == "headroom" and n.split("/")[1] in MAPPED] == []
    assert "scenarios/quickstart.yaml" in names


def test_the_installed_wheel_runs_a_shipped_scenario_from_an_empty_directory(
    dists: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _src, _sdist, wheel = dists
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "--no-deps", "--no-index", "--quiet", str(wheel)])
    dev = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(dev)  # runtime dependencies; its .pth files unprocessed
    env["PYTHONNOUSERSITE"] = "1"
    empty = tmp_path / "empty"
    empty.mkdir()

    probe = """
import json
import headroom, headroom.controllers
from headroom.kernel.settings import SCENARIOS_DIR
try:
    import controllers
    bare = controllers.__file__
except ModuleNotFoundError:
    bare = None
print(json.dumps({"headroom": headroom.__file__, "controllers": headroom.controllers.__file__,
                  "scenarios": str(SCENARIOS_DIR), "bare": bare}))
"""
    found = json.loads(_run([str(python), "-c", probe], cwd=empty, env=env).stdout)
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=empty,
            env=env,
        ).stdout.strip()
    ).resolve()
    for key in ("headroom", "controllers", "scenarios"):
        path = Path(found[key]).resolve()
        assert path.is_relative_to(site), (key, path)
        assert not path.is_relative_to(REPO.resolve()), (key, path)
    assert found["bare"] is None  # only headroom.controllers, no top-level controllers

    headroom = venv / "bin" / "headroom"
    out = empty / "out"
    simulate = [str(headroom), "simulate", "quickstart", "--policy", "static,headroom"]
    run = _run([*simulate, "--out", str(out), "--no-progress"], cwd=empty, env=env)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["scenario"] == "quickstart"
    assert list(metrics["policies"]) == ["static", "headroom"]
    assert str(out / "report.html") in run.stdout
    # a shipped scenario with CSV traces: they resolve inside the installed package
    check = _run([str(headroom), "scenario", "check", "worldcup98"], cwd=empty, env=env)
    assert check.stdout.startswith("worldcup98: OK, scenario 'worldcup98'")
    assert sorted(p.name for p in empty.iterdir()) == ["out"]  # nothing else written here
