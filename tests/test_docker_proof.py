"""tools/docker_proof.py without building anything: the apt sources, podman's configuration, the run
checks and the one-line refusals (no network, no podman, no root needed)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import resource
import sys
from pathlib import Path

import pytest

_TOOL = Path(__file__).resolve().parents[1] / "tools" / "docker_proof.py"
_spec = importlib.util.spec_from_file_location("docker_proof", _TOOL)
proof = importlib.util.module_from_spec(_spec)
sys.modules["docker_proof"] = proof  # NamedTuple needs its module importable by name
_spec.loader.exec_module(proof)
Source = proof.Source

tomllib = pytest.importorskip("tomllib")  # Python 3.11+: both stacks of this project


# --------------------------------------------------------------------------------------------
# apt sources: the one-line format and deb822
# --------------------------------------------------------------------------------------------
ONE_LINE = """\
# the main archive
deb http://deb.example.org/debian bookworm main contrib  # trailing comment
deb [arch=amd64 signed-by=/k.gpg] https://deb.example.org/debian-security bookworm-security main
deb-src http://deb.example.org/debian bookworm main
deb [broken http://nowhere bookworm main
   # an indented comment
deb cdrom:/media/cdrom/ bookworm main
deb http://only-a-uri
"""

DEB822 = """\
# first stanza
Types: deb deb-src
URIs: http://deb.example.org/debian
 http://mirror.example.net/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# a comment inside a stanza
URIs: http://disabled.example.org/debian
Suites: bookworm
Components: main
Enabled: no


Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
"""


def test_one_line_sources_are_parsed_with_options_and_comments_dropped():
    assert proof.parse_one_line_sources(ONE_LINE) == [
        Source(("deb",), ("http://deb.example.org/debian",), ("bookworm",), ("main", "contrib")),
        Source(("deb",), ("https://deb.example.org/debian-security",), ("bookworm-security",), ("main",)),
        Source(("deb-src",), ("http://deb.example.org/debian",), ("bookworm",), ("main",)),
        Source(("deb",), ("cdrom:/media/cdrom/",), ("bookworm",), ("main",)),
    ]


def test_deb822_sources_are_parsed_with_continuations_and_enabled():
    assert proof.parse_deb822_sources(DEB822) == [
        Source(("deb", "deb-src"), ("http://deb.example.org/debian", "http://mirror.example.net/debian"),
               ("bookworm", "bookworm-updates"), ("main",), True),
        Source(("deb",), ("http://disabled.example.org/debian",), ("bookworm",), ("main",), False),
        Source(("deb",), ("https://deb.nodesource.com/node_20.x",), ("nodistro",), ("main",), True),
    ]


def test_the_mirror_is_the_release_itself_with_main():
    assert proof.debian_mirror(proof.parse_one_line_sources(ONE_LINE)) == "http://deb.example.org/debian"
    assert proof.debian_mirror(proof.parse_deb822_sources(DEB822)) == "http://deb.example.org/debian"
    # not -security / -updates, not deb-src, not a disabled stanza, not without main, not cdrom:
    others = [
        Source(("deb",), ("http://a/debian-security",), ("bookworm-security",), ("main",)),
        Source(("deb",), ("http://b/debian",), ("bookworm-updates",), ("main",)),
        Source(("deb-src",), ("http://c/debian",), ("bookworm",), ("main",)),
        Source(("deb",), ("http://d/debian",), ("bookworm",), ("main",), False),
        Source(("deb",), ("http://e/debian",), ("bookworm",), ("stable",)),
        Source(("deb",), ("cdrom:/media/",), ("bookworm",), ("main",)),
    ]
    assert proof.debian_mirror(others) is None
    local = Source(("deb",), ("file:/srv/mirror/",), ("bookworm",), ("main",))
    assert proof.debian_mirror(others + [local]) == "file:/srv/mirror"
    ubuntu = proof.parse_one_line_sources("deb http://archive.ubuntu.com/ubuntu jammy main universe\n")
    assert proof.debian_mirror(ubuntu) is None
    assert proof.debian_mirror(ubuntu, release="jammy") == "http://archive.ubuntu.com/ubuntu"


def test_read_apt_sources_reads_the_files_apt_reads(tmp_path):
    apt = tmp_path / "etc" / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text("deb http://one/debian bookworm main\n")
    (apt / "sources.list.d" / "b.list").write_text("deb http://two/debian bookworm main\n")
    (apt / "sources.list.d" / "a.sources").write_text(
        "Types: deb\nURIs: http://three/debian\nSuites: bookworm\nComponents: main\n")
    (apt / "sources.list.d" / "c.sources.disabled").write_text(
        "Types: deb\nURIs: http://ignored/debian\nSuites: bookworm\nComponents: main\n")
    (apt / "sources.list.d" / "d.list.save").write_text("deb http://ignored/debian bookworm main\n")
    uris = [uri for source in proof.read_apt_sources(tmp_path) for uri in source.uris]
    assert uris == ["http://one/debian", "http://two/debian", "http://three/debian"]


def test_read_apt_sources_of_an_empty_root(tmp_path):
    assert proof.read_apt_sources(tmp_path) == []


# --------------------------------------------------------------------------------------------
# containers.conf
# --------------------------------------------------------------------------------------------
def test_containers_conf_uses_runc_and_the_given_limits():
    conf = tomllib.loads(proof.containers_conf(20000, 4096, systemd=True))
    assert conf == {"containers": {"default_ulimits": ["nofile=20000:20000", "nproc=4096:4096"]},
                    "engine": {"runtime": "runc"}}


def test_containers_conf_without_systemd_uses_cgroupfs_and_a_file_log():
    conf = tomllib.loads(proof.containers_conf(1024, 77, systemd=False))
    assert conf["containers"]["default_ulimits"] == ["nofile=1024:1024", "nproc=77:77"]
    assert conf["engine"] == {"runtime": "runc", "cgroup_manager": "cgroupfs", "events_logger": "file"}


@pytest.mark.parametrize("nofile, nproc", [(0, 4096), (20000, -1)])
def test_containers_conf_refuses_non_positive_limits(nofile, nproc):
    with pytest.raises(ValueError, match=f"nofile={nofile}, nproc={nproc}"):
        proof.containers_conf(nofile, nproc, systemd=True)


def test_container_limit_stays_within_the_hard_limit():
    assert proof.container_limit(20000) == 20000
    assert proof.container_limit(20000, 4096) == 4096
    assert proof.container_limit(1000, 4096) == 1000
    assert proof.container_limit(resource.RLIM_INFINITY) == 1048576
    assert proof.container_limit(resource.RLIM_INFINITY, 4096) == 4096


def test_machine_containers_conf_reads_this_process_hard_limit():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = 1048576 if hard == resource.RLIM_INFINITY else hard
    conf = tomllib.loads(proof.machine_containers_conf())
    assert conf["containers"]["default_ulimits"][0] == f"nofile={expected}:{expected}"


# --------------------------------------------------------------------------------------------
# checking a run
# --------------------------------------------------------------------------------------------
GOOD_LOG = ("steps: 300  final train loss: 3.1\n"
            "Parity vs Keras: max abs diff 0.5 on real tokens (0.5 with padding positions)\n"
            "Parity vs Keras: max abs diff 7.6e-06 on real tokens (8.1e-06 with padding positions)\n")


def _run_output(tmp_path, eval_loss=3.7076, unigram=5.25, final=3.5):
    demo = tmp_path / "demo"
    (demo / "checkpoints").mkdir(parents=True)
    (demo / "report.json").write_text(json.dumps(
        {"eval_loss": eval_loss, "unigram_eval_loss": unigram, "final_train_loss": final}))
    (demo / "checkpoints" / "ckpt-1.index").write_bytes(b"x")
    return tmp_path


def test_a_good_run_passes_every_check(tmp_path):
    out = _run_output(tmp_path)
    passed, failed = proof.check_run(out, 0, GOOD_LOG, uid=os.getuid())
    assert failed == []
    assert passed == ["exit status 0", "eval loss 3.7076 vs unigram baseline 5.2500 (below)",
                      "TFLite parity 7.6e-06 (tolerance 0.0001)",
                      f"all 4 files in /out owned by uid {os.getuid()}"]


@pytest.mark.parametrize("returncode, eval_loss, log, expected", [
    (1, 3.7, GOOD_LOG, "exit status 1"),
    (0, 5.25, GOOD_LOG, "eval loss 5.2500 vs unigram baseline 5.2500 (NOT below)"),
    (0, float("nan"), GOOD_LOG, "eval loss nan vs unigram baseline 5.2500 (NOT below)"),
    (0, 3.7, GOOD_LOG.replace("7.6e-06", "0.00011"), "TFLite parity 0.00011 (tolerance 0.0001)"),
    (0, 3.7, GOOD_LOG.replace("7.6e-06", "nan"), "TFLite parity nan (tolerance 0.0001)"),
    (0, 3.7, "steps: 300\n", "no 'Parity vs Keras' line in the output"),
])
def test_a_bad_run_names_the_failed_check(tmp_path, returncode, eval_loss, log, expected):
    out = _run_output(tmp_path, eval_loss=eval_loss)
    passed, failed = proof.check_run(out, returncode, log, uid=os.getuid())
    assert failed == [expected]
    assert len(passed) == 3


def test_files_of_another_owner_fail_the_run(tmp_path):
    out = _run_output(tmp_path)
    other = os.getuid() + 1
    _, failed = proof.check_run(out, 0, GOOD_LOG, uid=other)
    assert failed == [f"4 of 4 files not owned by uid {other}, e.g. {out / 'demo'}"]
    assert proof.files_not_owned_by(out, other) == sorted(
        [out / "demo", out / "demo" / "checkpoints", out / "demo" / "checkpoints" / "ckpt-1.index",
         out / "demo" / "report.json"])


def test_a_run_without_output_fails(tmp_path):
    _, failed = proof.check_run(tmp_path, 0, GOOD_LOG, uid=os.getuid())
    assert failed[0].startswith(f"no readable report at {tmp_path / 'demo' / 'report.json'}")
    assert failed[1:] == [f"nothing written to {tmp_path / 'demo'}"]


def test_parse_parity_takes_the_last_line():
    assert proof.parse_parity(GOOD_LOG) == 7.6e-06
    assert math.isnan(proof.parse_parity("Parity vs Keras: max abs diff nan on real tokens"))
    assert proof.parse_parity("Parity vs Keras: max abs diff x.y on real tokens") is None
    assert proof.parse_parity("") is None


def test_final_train_loss_is_read_exactly(tmp_path):
    assert proof.final_train_loss(_run_output(tmp_path, final=3.0625000000000004)) == 3.0625000000000004


# --------------------------------------------------------------------------------------------
# where the machine cannot: one line, exit 1 (0 with DOCKER_PROOF=skip)
# --------------------------------------------------------------------------------------------
@pytest.fixture
def machine(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_PROOF_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DEBIAN_MIRROR", raising=False)
    monkeypatch.delenv("DOCKER_PROOF", raising=False)
    monkeypatch.setattr(proof.sys, "platform", "linux")
    return monkeypatch


@pytest.mark.parametrize("skip", [False, True])
def test_not_root_is_one_line(machine, capsys, skip):
    machine.setattr(proof.os, "geteuid", lambda: 1000)
    if skip:
        machine.setenv("DOCKER_PROOF", "skip")
    assert proof.main([]) == (0 if skip else 1)
    lines = capsys.readouterr().out.splitlines()
    reason = "needs root (debootstrap, podman's storage in /var/lib/containers): run it as root or with sudo"
    assert lines == [f"docker-proof: skipped: {reason}" if skip else
                     f"docker-proof: cannot run here: {reason} (DOCKER_PROOF=skip to pass anyway)"]


def test_no_debian_mirror_is_one_line(machine, capsys):
    machine.setattr(proof.os, "geteuid", lambda: 0)
    machine.setattr(proof, "read_apt_sources", lambda root=None: proof.parse_one_line_sources(
        "deb http://archive.ubuntu.com/ubuntu jammy main\n"))
    assert proof.main([]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "docker-proof: cannot run here: no Debian bookworm mirror in this machine's apt sources "
        "(/etc/apt/sources.list, /etc/apt/sources.list.d/): set DEBIAN_MIRROR=URL "
        "(DOCKER_PROOF=skip to pass anyway)"]


def test_no_podman_and_no_apt_get_is_one_line(machine, capsys):
    machine.setattr(proof.os, "geteuid", lambda: 0)
    machine.setenv("DEBIAN_MIRROR", "http://deb.example.org/debian")
    machine.setattr(proof, "_which", lambda tool: "/usr/bin/runc" if tool == "runc" else None)
    machine.setenv("DOCKER_PROOF", "skip")
    assert proof.main([]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "docker-proof: skipped: podman, buildah, debootstrap missing and no apt-get to install them"]


def test_not_linux_is_one_line(machine, capsys):
    machine.setattr(proof.sys, "platform", "darwin")
    assert proof.main([]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "docker-proof: cannot run here: needs Linux (podman, debootstrap), this is darwin "
        "(DOCKER_PROOF=skip to pass anyway)"]


# --------------------------------------------------------------------------------------------
# the build is the real Dockerfile with --from, not an edited copy
# --------------------------------------------------------------------------------------------
def test_build_uses_the_repository_dockerfile_with_from(machine):
    commands = []
    runner = proof.Proof(proof.argparse.Namespace(twice=False))
    machine.setattr(runner, "run", commands.append)
    runner.build("localhost/keras-posenc:proof", no_cache=True)
    (command,) = commands
    assert command[:4] == ["podman", "build", "--format", "docker"]  # the Dockerfile's SHELL needs it
    assert command[command.index("--from") + 1] == "localhost/localbase:bookworm-py3.11"
    assert command[command.index("-f") + 1] == _TOOL.parents[1] / "docker" / "Dockerfile"
    assert command[-2:] == ["--no-cache", _TOOL.parents[1]]


def test_the_cached_base_is_reused_only_when_complete_and_of_the_same_packages(machine, tmp_path):
    runner = proof.Proof(proof.argparse.Namespace(twice=False))
    assert runner.rootfs == tmp_path / "cache" / "rootfs-bookworm-py3.11"
    assert not runner.base_cached()
    runner.rootfs.mkdir(parents=True)
    assert not runner.base_cached()  # debootstrap did not finish: no stamp
    stamp = runner.rootfs / ".docker-proof.json"
    stamp.write_text(json.dumps({"packages": list(proof.BASE_PACKAGES), "created": "2026-01-01T00:00"}))
    assert runner.base_cached()
    stamp.write_text(json.dumps({"packages": ["python3.11"], "created": "2026-01-01T00:00"}))
    assert not runner.base_cached()
    stamp.write_text("{")
    assert not runner.base_cached()
