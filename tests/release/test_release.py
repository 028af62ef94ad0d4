"""scripts/release: one version across the project, and the artefacts of that version.

The release is built with `--profile dev` (the binaries the suite already built; a release build
would take CI's two cores for minutes) into a temporary directory; the binary tarball is unpacked and
its programs run; the client artefacts are installed and run by tests/packaging. A copy of the
version files that disagree must stop the script before it builds anything."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSION = re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)


def test_the_release_holds_every_artefact_of_one_version(tmp_path):
    dist = tmp_path / "dist"
    done = subprocess.run([str(ROOT / "scripts" / "release"), "--profile", "dev", str(dist)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"version {VERSION} everywhere" in done.stdout, done.stdout
    sums = dict(reversed(line.split()) for line in (dist / "SHA256SUMS").read_text().splitlines())
    names = sorted(sums)
    binaries = [n for n in names if n.startswith(f"switchyard-{VERSION}-") and n.endswith(".tar.gz")]
    assert len(binaries) == 1, names
    assert any(n.startswith(f"switchyard_runner-{VERSION}-") and n.endswith(".whl") for n in names), names
    assert f"switchyard_runner-{VERSION}.tar.gz" in names, names
    assert any(n.endswith(f"-{VERSION}.tgz") for n in names), names
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=dist, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    with tarfile.open(dist / binaries[0]) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (top,) = (tmp_path / "unpacked").iterdir()
    for program, line in [("switchyard-server", f"switchyard-server {VERSION}"),
                          ("switchyard", f"switchyard {VERSION}"),
                          ("switchyard-agent", f"switchyard-agent {VERSION}")]:
        out = subprocess.run([str(top / "bin" / program), "--version"], capture_output=True, text=True)
        assert out.stdout.strip() == line, out
    assert "complete -c switchyard" in (top / "share" / "completions" / "switchyard.fish").read_text()
    assert ".TH switchyard" in (top / "share" / "man" / "man1" / "switchyard.1").read_text()
    assert (top / "CHANGELOG.md").read_text().count(f"## [{VERSION}]") == 1


def test_versions_that_disagree_stop_the_release_before_it_builds(tmp_path):
    for rel in ["Cargo.toml", "CHANGELOG.md", "scripts/release", "scripts/version", "clients/python/pyproject.toml",
                "clients/node/package.json", "clients/node/package-lock.json",
                "clients/python/switchyard_runner/runner.py", "clients/node/src/runner.js",
                "deploy/helm/switchyard/Chart.yaml", "deploy/helm/switchyard-agent/Chart.yaml"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp_path / rel)
    package = tmp_path / "clients/node/package.json"
    package.write_text(package.read_text().replace(f'"version": "{VERSION}"', '"version": "9.9.9"', 1))
    done = subprocess.run([str(tmp_path / "scripts" / "release"), str(tmp_path / "dist")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"version: clients/node/package.json says 9.9.9, Cargo.toml says {VERSION}" in done.stderr, done.stderr
    assert not any((tmp_path / "dist").iterdir())
