"""The Debian packages: scripts/package.sh builds muster, libmuster0 and
libmuster-dev (and their -dbgsym packages) with CPack; the test reads their
control data and contents, unpacks them into a throwaway root (dpkg-deb -x),
runs the binaries from there, verifies the units against that root, builds a
consumer with find_package(muster) and with pkg-config against its /usr
layout and runs it under the packaged muster, and runs the maintainer
scripts against stand-ins for systemd's tools."""
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from muster_testing import SLACK, base_env, build_ddp_linear

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r"project\(muster VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
MULTIARCH = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True,
                           check=True).stdout.strip()
LIBDIR = f"usr/lib/{MULTIARCH}"
NAMES = {"muster", "libmuster0", "libmuster-dev", "muster-dbgsym", "libmuster0-dbgsym"}


def field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True,
                          check=True).stdout.strip()


def contents(deb):
    """Path -> tar listing line, paths without the leading '.'."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    listing = {}
    for line in out.splitlines():
        path = line.split(None, 5)[5].split(" -> ")[0]
        listing[path.lstrip(".")] = line
    return listing


def readelf(flag, path):
    return subprocess.run(["readelf", flag, "-W", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    out = tmp_path_factory.mktemp("debs")
    # The test's own build tree, inside the build being tested.
    build = Path(os.environ["MUSTER_BUILD_DIR"]) / "deb"
    r = subprocess.run([str(ROOT / "scripts" / "package.sh"), str(out)], capture_output=True, text=True,
                       env=dict(os.environ, MUSTER_PACKAGE_BUILD_DIR=str(build)), timeout=1200 * SLACK)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    debs = {field(p, "Package"): p for p in list(out.glob("*.deb")) + list(out.glob("*.ddeb"))}
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in debs.values())  # nothing left over
    root = tmp_path_factory.mktemp("root")
    for p in debs.values():
        subprocess.run(["dpkg-deb", "-x", str(p), str(root)], check=True, timeout=120)
    return debs, root


def test_three_packages_with_computed_depends(packages):
    debs, _ = packages
    assert set(debs) == NAMES
    for name, deb in debs.items():
        assert field(deb, "Version") == f"{VERSION}-1", name
        assert field(deb, "Architecture") == subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                                                            text=True).stdout.strip()
        assert field(deb, "Maintainer")
    # dpkg-shlibdeps found what the binaries link: libcrypto among them, nothing of Boost or the build tree.
    depends = field(debs["muster"], "Depends")
    for lib in ("libc6", "libstdc++6", "libssl3"):
        assert re.search(rf"(^|, ){re.escape(lib)} \(>= [0-9.]+\)", depends), depends
    assert "boost" not in depends and "libmuster" not in depends
    assert "libssl3" not in field(debs["libmuster0"], "Depends")  # libmuster links no libcrypto
    assert field(debs["libmuster-dev"], "Depends") == f"libmuster0 (= {VERSION}-1)"
    assert field(debs["muster-dbgsym"], "Depends") == f"muster (= {VERSION}-1)"
    assert field(debs["muster"], "Section") == "net" and field(debs["libmuster-dev"], "Section") == "libdevel"
    # The synopsis, then the long description indented by exactly one space.
    description = field(debs["muster"], "Description").splitlines()
    assert description[0] == "torchrun-compatible launcher for distributed training"
    assert all(line.startswith(" ") and not line.startswith("  ") for line in description[1:]), description
    # libmuster0 tells dpkg-shlibdeps of its consumers which version they need.
    shlibs = subprocess.run(f"dpkg-deb --ctrl-tarfile {debs['libmuster0']} | tar -xO ./shlibs", shell=True,
                            capture_output=True, text=True, check=True).stdout.strip()
    assert shlibs == f"libmuster 0 libmuster0 (>= {VERSION}-1)"


def test_lintian_finds_nothing_to_fix(packages):
    debs, _ = packages
    lintian = shutil.which("lintian")
    assert lintian, "lintian is missing: scripts/install-deps.sh installs it"
    # Not about these packages: initial-upload-closes-no-bugs asks a first upload to
    # Debian's archive to close its ITP bug; maintscript-calls-ldconfig is CPack's own
    # ldconfig call in libmuster0's scripts, beside the trigger that does the work.
    r = subprocess.run([lintian, "--fail-on", "error,warning", "--suppress-tags",
                        "initial-upload-closes-no-bugs,maintscript-calls-ldconfig", *map(str, debs.values())],
                       capture_output=True, text=True, timeout=300 * SLACK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [line for line in r.stdout.splitlines() if re.match(r"[EW]: ", line)], r.stdout


def test_each_package_holds_its_part(packages):
    debs, _ = packages
    files = {name: contents(deb) for name, deb in debs.items()}
    expected = {
        "muster": ["/usr/bin/muster", "/usr/bin/musterd", "/usr/bin/musterctl",
                   "/usr/lib/systemd/system/musterd.service", "/usr/lib/systemd/system/muster@.service",
                   "/usr/share/man/man1/muster.1.gz", "/usr/share/man/man1/musterctl.1.gz",
                   "/usr/share/man/man8/musterd.8.gz", "/usr/share/bash-completion/completions/muster",
                   "/usr/share/bash-completion/completions/musterd",
                   "/usr/share/bash-completion/completions/musterctl", "/usr/share/doc/muster/copyright",
                   "/usr/share/doc/muster/operations.md", "/usr/share/doc/muster/security.md",
                   "/usr/share/doc/muster/changelog.Debian.gz"],
        "libmuster0": [f"/{LIBDIR}/libmuster.so.0", f"/{LIBDIR}/libmuster.so.{VERSION}",
                       "/usr/share/doc/libmuster0/copyright", "/usr/share/doc/libmuster0/changelog.Debian.gz"],
        "libmuster-dev": [f"/{LIBDIR}/libmuster.so", "/usr/include/muster/muster.hpp",
                          "/usr/include/muster/process_group.hpp", f"/{LIBDIR}/cmake/muster/musterConfig.cmake",
                          f"/{LIBDIR}/pkgconfig/muster.pc", "/usr/share/doc/libmuster-dev/copyright"],
    }
    for name, paths in expected.items():
        missing = [p for p in paths if p not in files[name]]
        assert not missing, (name, missing)
    # Nothing is in two packages, nothing outside /usr, executables 0755, the rest 0644.
    seen = {}
    for name, listing in files.items():
        for path, line in listing.items():
            if line.startswith("d"):
                assert path in ("/", "/usr/") or path.startswith("/usr/"), (name, path)
                continue
            assert path.startswith("/usr/"), (name, path)
            assert path not in seen, (path, name, seen.get(path))
            seen[path] = name
            mode = line.split()[0]
            if path.startswith("/usr/bin/"):
                assert mode == "-rwxr-xr-x", (path, mode)
            elif line.startswith("-"):  # libraries and debug symbols too, as dh_fixperms leaves them; links any
                assert mode == "-rw-r--r--", (path, mode)
    assert not [p for p in files["muster"] if "include" in p or p.endswith(".so")]


def test_binaries_are_stripped_and_their_symbols_are_in_the_dbgsym_packages(packages):
    _, root = packages
    for path in ["usr/bin/muster", "usr/bin/musterd", "usr/bin/musterctl", f"{LIBDIR}/libmuster.so.{VERSION}"]:
        sections = readelf("-S", root / path)
        assert ".debug_info" not in sections and ".symtab" not in sections, path
        assert ".gnu_debuglink" in sections, path
        build_id = re.search(r"Build ID: ([0-9a-f]+)", readelf("-n", root / path)).group(1)
        debug = root / "usr/lib/debug/.build-id" / build_id[:2] / f"{build_id[2:]}.debug"
        assert debug.exists(), path
        assert ".debug_info" in readelf("-S", debug), path


def test_the_unpacked_binaries_run_and_their_pages_and_completion_work(packages):
    _, root = packages
    for name in ("muster", "musterd", "musterctl"):
        r = subprocess.run([str(root / "usr/bin" / name), "--version"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.startswith(f"{name} {VERSION}"), (name, r.stdout, r.stderr)
    for page in ("man1/muster.1.gz", "man1/musterctl.1.gz", "man8/musterd.8.gz"):
        r = subprocess.run(["man", "--warnings", "-l", str(root / "usr/share/man" / page)], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8"))
        assert r.returncode == 0 and r.stderr == "" and "OPTIONS" in r.stdout, (page, r.stderr)
    completion = root / "usr/share/bash-completion/completions/muster"
    r = subprocess.run(["bash", "-c", f"source {completion} && complete -p muster musterd musterctl"],
                       capture_output=True, text=True, timeout=30)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and [line.split()[-1] for line in lines] == ["muster", "musterd", "musterctl"], r.stdout
    assert all(re.search(r" -F _\w+ ", line) for line in lines), r.stdout


def test_the_installed_units_verify_against_the_package_root(packages, tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/install-deps.sh installs systemd"
    _, packaged = packages
    # A root of its own: the packaged units and binaries, with the host's own
    # units (targets) and kill beside them, as on a machine that installed muster.
    root = tmp_path / "root"
    shutil.copytree(packaged, root, symlinks=True)
    units = root / "usr/lib/systemd/system"
    assert "ExecStart=/usr/bin/musterd $MUSTERD_ARGS" in (units / "musterd.service").read_text()
    assert "ExecStart=/usr/bin/muster $MUSTER_ARGS" in (units / "muster@.service").read_text()
    for d in ("/lib/systemd/system", "/usr/lib/systemd/system"):
        if Path(d).is_dir():
            subprocess.run(["cp", "-rn", f"{d}/.", str(units)], check=True)
    (root / "bin").mkdir(exist_ok=True)
    shutil.copy2("/bin/kill", root / "bin" / "kill")
    r = subprocess.run([analyze, "verify", f"--root={root}", "musterd.service", "muster@job.service"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    # verify checks the binaries in that root: without musterd it fails.
    (root / "usr/bin/musterd").unlink()
    r = subprocess.run([analyze, "verify", f"--root={root}", "musterd.service"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "/usr/bin/musterd" in r.stdout + r.stderr
    s = subprocess.run([analyze, "security", "--offline=yes", str(units / "musterd.service")], capture_output=True,
                       text=True, timeout=60)
    score = float(re.search(r"Overall exposure level for musterd.service: ([0-9.]+)", s.stdout + s.stderr).group(1))
    assert score <= 2.0, s.stdout


def test_a_consumer_builds_against_the_packages_and_runs_under_the_packaged_muster(packages, tmp_path):
    _, root = packages
    usr = root / "usr"
    example = ROOT / "examples" / "ddp_linear"
    build = tmp_path / "build"
    consumer = build_ddp_linear(build, f"-DCMAKE_PREFIX_PATH={usr}")
    cache = (build / "CMakeCache.txt").read_text()
    assert f"muster_DIR:PATH={usr}/lib/{MULTIARCH}/cmake/muster" in cache
    libs = str(usr / "lib" / MULTIARCH)
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([str(usr / "bin/muster"), "--standalone", "--nproc-per-node=2", "--no-python",
                        str(consumer), str(out), "1"], env=base_env(LD_LIBRARY_PATH=libs),
                       capture_output=True, text=True, timeout=300 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "checkpoint.txt").exists() and "all 2 ranks hold the same weights" in r.stdout
    ldd = subprocess.run(["ldd", str(consumer)], env=dict(os.environ, LD_LIBRARY_PATH=libs),
                         capture_output=True, text=True).stdout
    assert f"{libs}/libmuster.so.0" in ldd, ldd

    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "muster"], capture_output=True, text=True,
                        env=dict(os.environ, PKG_CONFIG_PATH=f"{libs}/pkgconfig"))
    assert pc.returncode == 0, pc.stderr
    words = pc.stdout.split()
    assert [Path(w[2:]).resolve() for w in words if w.startswith("-I")] == [(usr / "include").resolve()], words
    assert [Path(w[2:]).resolve() for w in words if w.startswith("-L")] == [Path(libs).resolve()], words
    assert "-lmuster" in words and not [w for w in words if w.startswith("-std")]
    exe = tmp_path / "ddp_linear_pc"
    r = subprocess.run(["g++", "-std=c++20", str(example / "main.cpp"), "-o", str(exe), *words],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(usr / "bin/muster"), "--standalone", "--nproc-per-node=2", "--no-python", str(exe),
                        str(out), "1"], env=base_env(LD_LIBRARY_PATH=libs), capture_output=True, text=True,
                       timeout=300 * SLACK)
    assert r.returncode == 0 and "all 2 ranks hold the same weights" in r.stdout, r.stderr[-3000:]


HELPER = ["deb-systemd-helper unmask musterd.service", "deb-systemd-helper update-state musterd.service"]


# (script, arguments, calls without systemd as init, calls with it)
@pytest.mark.parametrize("script,args,without,with_systemd", [
    ("postinst", ["configure", ""], HELPER, HELPER + ["systemctl --system daemon-reload"]),
    ("postinst", ["configure", "0.0.9-1"], HELPER,
     HELPER + ["systemctl --system daemon-reload", "deb-systemd-invoke try-restart musterd.service"]),
    ("prerm", ["remove"], [], ["deb-systemd-invoke stop musterd.service"]),
    ("prerm", ["upgrade", "0.2.0-1"], [], []),
    ("postrm", ["remove"], [], ["systemctl --system daemon-reload"]),
    ("postrm", ["purge"], ["deb-systemd-helper purge musterd.service", "deb-systemd-helper unmask musterd.service"],
     ["systemctl --system daemon-reload", "deb-systemd-helper purge musterd.service",
      "deb-systemd-helper unmask musterd.service"]),
])
def test_the_maintainer_scripts_never_enable_or_start_anything(packages, tmp_path, script, args, without,
                                                                 with_systemd):
    debs, _ = packages
    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", str(debs["muster"]), str(control)], check=True)
    path = control / script
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    for tool in ("systemctl", "deb-systemd-helper", "deb-systemd-invoke"):
        # Each stand-in records its call and fails: a failing helper must not fail the package's configuration.
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    def run(systemd_as_init):
        log.unlink(missing_ok=True)
        # Whether systemd is init is what /run/systemd/system says: a mount namespace
        # with a /run of its own gives the script either answer.
        setup = "mount -t tmpfs muster-test /run" + (" && mkdir -p /run/systemd/system" if systemd_as_init else "")
        r = subprocess.run(["unshare", "-m", "sh", "-c", f'{setup} && exec sh "$0" "$@"', str(path), *args],
                           env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return log.read_text().splitlines() if log.exists() else []

    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and mount namespaces (unshare -m) to give the scripts a /run of their own")
    assert run(False) == without
    assert run(True) == with_systemd
