"""Tests of the training image builder (hack/node/trainimage.py), the demo
jobs from it (nodecfg.py jobs --image) and the over-budget attack's check
(report.py). Run: python3 -m pytest -q hack/node"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import nodecfg  # noqa: E402
import report  # noqa: E402
import trainimage  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def fake_env(tmp: Path):
    """A virtual environment whose python links to a base prefix elsewhere
    (as /opt/torch/.venv does), and a wheel with an ELF library inside."""
    base = tmp / "base"
    (base / "bin").mkdir(parents=True)
    (base / "lib/python3.11/test").mkdir(parents=True)
    (base / "lib/python3.11/site-packages/other").mkdir(parents=True)
    (base / "lib/python3.11/os.py").write_text("# stdlib\n")
    (base / "lib/python3.11/test/big.py").write_text("# the stdlib's tests\n")
    (base / "lib/python3.11/site-packages/other/__init__.py").write_text("")
    python = base / "bin/python3.11"
    python.write_bytes(Path(os.path.realpath(sys.executable)).read_bytes())
    python.chmod(0o755)
    venv = tmp / "venv"
    sp = venv / "lib/python3.11/site-packages"
    (sp / "torchish").mkdir(parents=True)
    (sp / "torchish/__init__.py").write_text("x = 1\n")
    (sp / "vramfit").mkdir()
    (sp / "vramfit/old.py").write_text("# an older vramfit, replaced by the wheel's\n")
    (venv / "bin").mkdir()
    (venv / "bin/python").symlink_to(python)
    (venv / "pyvenv.cfg").write_text(f"home = {base}/bin\ninclude-system-site-packages = false\n")
    wheel = tmp / "vramfit-0.1.0-py3-none-linux_x86_64.whl"
    lib = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6")
               if os.path.exists(p))
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vramfit/__init__.py", "VERSION = '0.1.0'\n")
        z.write(lib, "vramfit/libvramfit_alloc.so")
        z.writestr("vramfit-0.1.0.dist-info/METADATA", "Name: vramfit\n")
    return venv, base, wheel


def build(tmp: Path):
    venv, base, wheel = fake_env(tmp)
    layer, inline, figures = trainimage.plan(str(venv), str(wheel), str(REPO / "hack/node/train.py"), 65532, print)
    buf = io.BytesIO()
    size, diff_id = trainimage.write_image(layer, inline, buf, "localhost/vramfit/train-venv:test", 65532, str(venv))
    return venv, base, buf.getvalue(), size, diff_id, figures


def test_the_image_is_a_docker_archive_whose_layer_matches_its_planned_size_and_diff_id(tmp_path):
    venv, base, data, size, diff_id, _ = build(tmp_path)
    assert len(data) == size
    with tarfile.open(fileobj=io.BytesIO(data)) as outer:
        names = outer.getnames()
        # The layer first (streamed), then what names it.
        assert names == ["layer/layer.tar", "config.json", "manifest.json"]
        layer = outer.extractfile("layer/layer.tar").read()
        config = json.loads(outer.extractfile("config.json").read())
        manifest = json.loads(outer.extractfile("manifest.json").read())
    assert "sha256:" + hashlib.sha256(layer).hexdigest() == diff_id == config["rootfs"]["diff_ids"][0]
    assert manifest == [{"Config": "config.json", "RepoTags": ["localhost/vramfit/train-venv:test"], "Layers": ["layer/layer.tar"]}]
    assert config["config"]["User"] == "65532:65532"
    assert f"VIRTUAL_ENV={venv}" in config["config"]["Env"]


def test_the_layer_holds_the_environment_its_base_the_wheel_and_the_libraries_they_need(tmp_path):
    venv, base, data, _, _, figures = build(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(data)) as outer:
        layer = outer.extractfile("layer/layer.tar").read()
    with tarfile.open(fileobj=io.BytesIO(layer)) as t:
        members = {m.name.rstrip("/"): m for m in t.getmembers()}
        sp = str(venv).strip("/") + "/lib/python3.11/site-packages"
        assert sp + "/torchish/__init__.py" in members
        assert members[str(venv).strip("/") + "/bin/python"].issym()
        # The wheel's package replaces the environment's own.
        assert sp + "/vramfit/libvramfit_alloc.so" in members and sp + "/vramfit/old.py" not in members
        assert members[sp + "/vramfit/libvramfit_alloc.so"].mode & 0o111
        b = str(base).strip("/")
        assert b + "/lib/python3.11/os.py" in members and b + "/bin/python3.11" in members
        # Not the base's own site-packages (the environment does not use them) nor its tests.
        assert b + "/lib/python3.11/site-packages/other/__init__.py" not in members
        assert b + "/lib/python3.11/test/big.py" not in members
        assert "opt/vramfit/train.py" in members
        passwd = t.extractfile("etc/passwd").read().decode()
        assert "trainer:x:65532:65532:" in passwd
        assert members["tmp"].mode & 0o1777 == 0o1777
        # libc, which the interpreter needs, and the loader, with their links.
        libs = [n for n in members if "/libc.so.6" in n]
        assert libs, sorted(members)[:50]
        # What the driver's libraries link, for CDI's mount of the driver tree.
        assert any(n.endswith("/libpthread.so.0") for n in members) and any(n.endswith("/libdl.so.2") for n in members)
        assert any("ld-linux-x86-64.so.2" in n for n in members)
        # Every file is readable by the image's non-root user.
        assert all(m.mode & 0o444 == 0o444 for m in members.values() if m.isfile())
    assert figures["systemLibraries"] > 0


def test_elf_deps_reads_needed_and_interpreter():
    needed, folders, interp = trainimage.elf_deps(os.path.realpath(sys.executable))
    assert any(n.startswith("libc.so") for n in needed) or any(n.startswith("libpython") for n in needed)
    assert interp and "ld-linux" in interp
    assert trainimage.elf_deps(str(REPO / "README.md")) is None


def test_image_jobs_mount_nothing_of_the_node_and_meet_restricted():
    jobs = nodecfg.demo_jobs(str(REPO), "/opt/torch/.venv/bin/python", [], 5, gpu=True,
                             image="localhost/vramfit/train-venv:dev", namespaces=["team-a", "team-b"])
    names = [j["metadata"]["name"] for j in jobs]
    assert "overbudget-twice" in names and {j["metadata"]["namespace"] for j in jobs} == {"team-a", "team-b"}
    for j in jobs:
        spec = j["spec"]["template"]["spec"]
        assert "volumes" not in spec and not spec.get("hostNetwork")
        assert spec["securityContext"]["runAsNonRoot"] is True
        c = spec["containers"][0]
        assert c["image"] == "localhost/vramfit/train-venv:dev"
        assert c["command"][:2] == ["/opt/torch/.venv/bin/python", nodecfg.IMAGE_TRAIN_PATH]
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        assert "volumeMounts" not in c and not any(e["name"] == "PYTHONPATH" for e in c.get("env", []))
    twice = next(j for j in jobs if j["metadata"]["name"] == "overbudget-twice")
    cmd = twice["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--bypass-attempts") + 1] == "2"
    cpu = nodecfg.demo_jobs(str(REPO), "/v/bin/python", [], 3, gpu=False, image="i", namespaces=["team-a", "team-b"])
    assert [j["metadata"]["namespace"] for j in cpu] == ["team-a", "team-b"]


def sample(at: str, used: int, pod: str = "overbudget-twice-a1", reports=()) -> dict:
    return {"status": {"heartbeat": at, "gpus": [{"index": 0, "processes": [{"podName": pod, "usedBytes": used}]}],
                       "oomReports": list(reports)}}


def twice_summary(samples, outcomes=("OutOfMemory", "OutOfMemory"), phase="Succeeded", survived=False):
    report_of = lambda p: {"podName": p, "usedBytes": 21 << 30, "budgetBytes": 10 << 30, "reason": "over budget"}  # noqa: E731
    job = {"name": "overbudget-twice", "phase": phase,
           "history": [{"attempt": i + 1, "outcome": o} for i, o in enumerate(outcomes)],
           "attempts": [{"pod": f"overbudget-twice-a{n}", "bypass": {"heldBytes": 20 << 30},
                         "bypassSurvived": {"event": "bypass-survived"} if survived else None} for n in (1, 2, 3)]}
    reports = {p: report_of(p) for p in ("overbudget-twice-a1", "overbudget-twice-a2")}
    return {"jobs": [job], "gpuNode": {}, "oomReportsSeen": reports, "overBudgetSeen": report.over_budget_seen(samples)}


def test_a_job_over_its_budget_twice_passes_when_each_episode_is_stopped_quickly():
    r = {"podName": "overbudget-twice-a1", "budgetBytes": 10 << 30}
    samples = [sample("2026-01-01T00:00:00Z", 21 << 30, reports=[r]), sample("2026-01-01T00:00:08Z", 21 << 30, reports=[r])]
    [(name, ok, detail)] = report.overbudget_twice_checks(twice_summary(samples), gpu=True, expected=True)
    assert ok, detail
    assert "8s" in detail


def test_a_job_over_its_budget_twice_fails_when_it_stays_over_or_is_not_stopped_again():
    r = {"podName": "overbudget-twice-a1", "budgetBytes": 10 << 30}
    long = [sample("2026-01-01T00:00:00Z", 21 << 30, reports=[r]), sample("2026-01-01T00:02:00Z", 21 << 30, reports=[r])]
    [(_, ok, detail)] = report.overbudget_twice_checks(twice_summary(long), gpu=True, expected=True)
    assert not ok and "longer than" in detail
    [(_, ok, detail)] = report.overbudget_twice_checks(twice_summary([], outcomes=("OutOfMemory", "Succeeded")),
                                                       gpu=True, expected=True)
    assert not ok and "not both OutOfMemory" in detail
    [(_, ok, _)] = report.overbudget_twice_checks(twice_summary([], survived=True), gpu=True, expected=True)
    assert not ok


def test_without_a_gpu_the_over_budget_attack_is_a_skip():
    [(name, ok, detail)] = report.overbudget_twice_checks({"jobs": [], "gpuNode": {}}, gpu=False, expected=True)
    assert ok is None and "no GPU" in detail


def test_nri_config_names_the_agent_namespaces():
    assert nodecfg.nri_plugin_config("/l") == 'log: "/l"\n'
    assert nodecfg.nri_plugin_config("/l", ["vramfit-system"]) == 'log: "/l"\nagentNamespaces: ["vramfit-system"]\n'


def test_oci_uncompressed_keeps_the_image_and_its_diff_ids():
    import gzip

    layer = b"layer bytes" * 100
    gz = gzip.compress(layer)
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}).encode()
    sha = lambda b: "sha256:" + hashlib.sha256(b).hexdigest()  # noqa: E731
    manifest = json.dumps({"schemaVersion": 2, "config": {"digest": sha(config), "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "digest": sha(gz), "size": len(gz)}]}).encode()
    index = {"manifests": [{"digest": sha(manifest), "size": len(manifest), "annotations": {"io.containerd.image.name": "x:1"}}]}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, body in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", json.dumps(index).encode()),
                           ("blobs/" + sha(config).replace(":", "/"), config), ("blobs/" + sha(manifest).replace(":", "/"), manifest),
                           ("blobs/" + sha(gz).replace(":", "/"), gz)]:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    out = nodecfg.oci_uncompressed(buf.getvalue())
    with tarfile.open(fileobj=io.BytesIO(out)) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    new_index = json.loads(files["index.json"])
    desc = new_index["manifests"][0]
    assert desc["annotations"] == {"io.containerd.image.name": "x:1"}
    m = json.loads(files["blobs/" + desc["digest"].replace(":", "/")])
    assert sha(files["blobs/" + desc["digest"].replace(":", "/")]) == desc["digest"]
    [l] = m["layers"]
    assert l["mediaType"] == "application/vnd.oci.image.layer.v1.tar" and l["size"] == len(layer)
    assert files["blobs/" + l["digest"].replace(":", "/")] == layer
    assert l["digest"] == json.loads(config)["rootfs"]["diff_ids"][0]
    assert files["blobs/" + sha(config).replace(":", "/")] == config
