"""Tests of the GPU node's generated files (hack/node/nodecfg.py) and the demo
summary (hack/node/report.py). Run: python3 -m pytest -q hack/node"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import nodecfg  # noqa: E402
import report  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_containerd_config_restricts_oom_score_adj_and_uses_cgroupfs_overlayfs_cdi_nri():
    text = nodecfg.containerd_config("/var/lib/n", "/opt/bin/runc")
    c = tomllib.loads(text)
    assert c["version"] == 3
    assert c["grpc"]["address"] == "/var/lib/n/containerd.sock"
    rt = c["plugins"]["io.containerd.cri.v1.runtime"]
    # Without CAP_SYS_RESOURCE runc cannot lower oom_score_adj: every sandbox fails otherwise.
    assert rt["restrict_oom_score_adj"] is True
    assert rt["enable_cdi"] is True and rt["cdi_spec_dirs"] == ["/var/lib/n/cdi"]
    runc = rt["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": "/opt/bin/runc", "SystemdCgroup": False}
    assert rt["cni"]["bin_dirs"] == ["/var/lib/n/cni/bin"] and rt["cni"]["conf_dir"] == "/var/lib/n/cni/net.d"
    images = c["plugins"]["io.containerd.cri.v1.images"]
    assert images["snapshotter"] == "overlayfs"
    assert images["pinned_images"]["sandbox"] == nodecfg.PAUSE_IMAGE
    nri = c["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["plugin_path"] == "/var/lib/n/nri/plugins"


def test_containerd_config_quotes_paths():
    c = tomllib.loads(nodecfg.containerd_config('/tmp/a "b"', "/r"))
    assert c["root"] == '/tmp/a "b"/containerd/root'


def test_kubelet_config_cgroupfs_swap_static_cpu():
    k = json.loads(nodecfg.kubelet_config("/var/lib/n/", "unix:///var/lib/n/containerd.sock", 10248, 10250, cpus=16))
    assert k["kind"] == "KubeletConfiguration"
    assert k["cgroupDriver"] == "cgroupfs"
    assert k["failSwapOn"] is False
    assert k["containerRuntimeEndpoint"] == "unix:///var/lib/n/containerd.sock"
    assert k["cpuManagerPolicy"] == "static" and k["reservedSystemCPUs"] == "0"
    assert (k["address"], k["healthzBindAddress"], k["readOnlyPort"]) == ("127.0.0.1", "127.0.0.1", 0)
    assert k["staticPodPath"] == "/var/lib/n/kubelet/manifests"
    k = json.loads(nodecfg.kubelet_config("/n", "unix:///s", 1, 2, cpus=1, cpu_manager="none"))
    assert k["cpuManagerPolicy"] == "none" and "reservedSystemCPUs" not in k


def test_kubelet_config_accepts_the_cluster_ca_for_its_api():
    k = json.loads(nodecfg.kubelet_config("/n", "unix:///s", 1, 2, cpus=4, client_ca="/n/pki/ca.crt"))
    assert k["authentication"]["x509"] == {"clientCAFile": "/n/pki/ca.crt"}
    assert k["authentication"]["anonymous"] == {"enabled": False}
    assert json.loads(nodecfg.kubelet_config("/n", "unix:///s", 1, 2, cpus=4))["authentication"]["x509"] == {}


def test_node_kubeconfig_uses_the_node_certificate(tmp_path, capsys):
    import yaml

    pki = tmp_path / "pki"
    pki.mkdir()
    for f in ("ca.crt", "node.crt", "node.key"):
        (pki / f).write_text("x")
    assert nodecfg.main(["kubeconfig", "--server", "https://127.0.0.1:6443", "--pki", str(pki)]) == 1
    assert "node-name is missing" in capsys.readouterr().err
    (pki / "node-name").write_text("gpu-1\n")
    assert nodecfg.main(["kubeconfig", "--server", "https://127.0.0.1:6443", "--pki", str(pki)]) == 0
    k = yaml.safe_load(capsys.readouterr().out)
    user = k["users"][0]
    assert user["name"] == "system:node:gpu-1"
    assert user["user"] == {"client-certificate": str(pki / "node.crt"), "client-key": str(pki / "node.key")}
    assert k["clusters"][0]["cluster"] == {"server": "https://127.0.0.1:6443", "certificate-authority": str(pki / "ca.crt")}
    assert k["contexts"][0]["context"]["user"] == user["name"] and k["current-context"] == k["contexts"][0]["name"]


def test_kubelet_config_rejects_static_cpu_on_one_cpu_and_unknown_policies():
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        nodecfg.kubelet_config("/n", "unix:///s", 1, 2, cpus=1)
    with pytest.raises(ValueError, match="static or none"):
        nodecfg.kubelet_config("/n", "unix:///s", 1, 2, cpus=8, cpu_manager="dynamic")


def test_cni_network_is_loopback_only():
    c = json.loads(nodecfg.cni_config())
    assert [p["type"] for p in c["plugins"]] == ["loopback"]


def test_cni_bridge_network_needs_no_ip_binary_forwarding_or_nat():
    c = json.loads(nodecfg.cni_bridge_config("vramfit0", "10.89.0.0/24", "/n/cni/ipam"))
    assert c["cniVersion"] == "1.0.0" and c["name"] == "vramfit-bridge"
    assert [p["type"] for p in c["plugins"]] == ["loopback", "bridge"]
    br = c["plugins"][1]
    assert br["bridge"] == "vramfit0"
    # isGateway would turn on ip_forward, ipMasq needs iptables.
    assert br["isGateway"] is False and br["isDefaultGateway"] is False and br["ipMasq"] is False
    assert br["ipam"] == {"type": "host-local", "ranges": [[{"subnet": "10.89.0.0/24", "gateway": "10.89.0.1"}]],
                          "routes": [{"dst": "0.0.0.0/0", "gw": "10.89.0.1"}], "dataDir": "/n/cni/ipam"}


def test_cni_isolated_network_names_its_plugin():
    c = json.loads(nodecfg.cni_isolated_config("10.89.1.0/24", "/n/cni/ipam"))
    assert [p["type"] for p in c["plugins"]] == ["loopback", "vramfit-isolated"]
    assert c["plugins"][1] == {"type": "vramfit-isolated", "subnet": "10.89.1.0/24", "dataDir": "/n/cni/ipam"}


def test_cni_isolated_plugin_hands_out_and_takes_back_addresses(tmp_path):
    plugin = Path(__file__).with_name("cni-isolated.py")
    conf = json.dumps({"cniVersion": "1.0.0", "name": "vramfit-isolated", "type": "vramfit-isolated",
                       "subnet": "10.89.1.0/24", "dataDir": str(tmp_path)})

    def run(command, container):
        env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=container, CNI_IFNAME="eth0",
                   CNI_NETNS="/proc/1/ns/net")
        p = subprocess.run([sys.executable, str(plugin)], input=conf, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(p.stdout) if p.stdout else None

    a = run("ADD", "a")
    assert a["ips"] == [{"address": "10.89.1.2/24", "interface": 0}] and a["interfaces"][0]["name"] == "eth0"
    assert run("ADD", "b")["ips"][0]["address"] == "10.89.1.3/24"
    assert run("ADD", "a")["ips"][0]["address"] == "10.89.1.2/24"   # the same container, the same address
    run("DEL", "a")
    assert run("ADD", "c")["ips"][0]["address"] == "10.89.1.2/24"
    assert run("VERSION", "")["supportedVersions"] == ["0.4.0", "1.0.0"]


def test_oci_netns_lists_the_pods_network_namespaces():
    def info(ns):
        return json.dumps({"ID": "x", "Spec": {"linux": {"namespaces": ns}}}, indent=2)

    text = "\n".join([
        info([{"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-aaa"}]),
        info([{"type": "network", "path": "/var/run/netns/cni-aaa"}]),          # its containers join it too
        info([{"type": "network", "path": "/run/netns/cni-bbb"}]),
        info([{"type": "network", "path": "/proc/42/ns/net"}]),                 # not a bind mount of containerd's
        info([{"type": "network", "path": "/run/netns/../etc"}]),
        info([{"type": "network"}]),                                           # a new namespace, no path
        json.dumps({"ID": "y"}),
    ])
    assert nodecfg.oci_netns(text) == ["/run/netns/cni-bbb", "/var/run/netns/cni-aaa"]


def test_cni_command_line(capsys):
    assert nodecfg.main(["cni", "--bridge", "br9", "--subnet", "10.9.0.0/24", "--data-dir", "/d"]) == 0
    assert json.loads(capsys.readouterr().out)["plugins"][1]["bridge"] == "br9"
    assert nodecfg.main(["cni", "--isolated", "--subnet", "10.9.1.0/24", "--data-dir", "/d"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "vramfit-isolated"
    assert nodecfg.main(["cni"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "vramfit-lo"
    assert nodecfg.main(["cni", "--bridge", "br9"]) == 1
    assert "--data-dir" in capsys.readouterr().err


def fake_driver(tmp_path: Path, gpus=((0, "GPU-aaaa-0000"), (1, "GPU-bbbb-1111")), uvm=True, libcuda=True):
    dev, proc, drv = tmp_path / "dev", tmp_path / "proc", tmp_path / "nvidia"
    dev.mkdir()
    for name in ["nvidiactl"] + (["nvidia-uvm", "nvidia-uvm-tools"] if uvm else []):
        (dev / name).touch()
    for minor, uuid in gpus:
        (dev / f"nvidia{minor}").touch()
        info = proc / "gpus" / f"0000:{minor + 1:02x}:00.0"
        info.mkdir(parents=True)
        (info / "information").write_text(
            f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\nVideo BIOS: \t ??\nDevice Minor: \t {minor}\n"
        )
    (drv / "bin").mkdir(parents=True)
    (drv / "bin" / "nvidia-smi").touch()
    (drv / "lib64").mkdir()
    if libcuda:
        (drv / "lib64" / "libcuda.so.1").touch()
    return dev, proc, drv


def test_cdi_spec_from_a_fake_driver_tree(tmp_path):
    dev, proc, drv = fake_driver(tmp_path)
    spec = nodecfg.cdi_spec(str(drv), str(dev), str(proc))
    assert spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == ["0", "GPU-aaaa-0000", "1", "GPU-bbbb-1111"]
    by_name = {d["name"]: d for d in spec["devices"]}
    # Each GPU brings only its own node: per-GPU selection.
    # The container path is always under /dev; the host's node is where it
    # is on this machine.
    assert by_name["GPU-bbbb-1111"]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": str(dev / "nvidia1")}
    ]
    shared = spec["containerEdits"]
    assert [n["path"] for n in shared["deviceNodes"]] == ["/dev/" + n for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")]
    assert [n["hostPath"] for n in shared["deviceNodes"]] == [str(dev / n) for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")]
    assert [m["containerPath"] for m in shared["mounts"]] == [str(drv / "bin"), str(drv / "lib64")]
    assert all("ro" in m["options"] for m in shared["mounts"])
    assert shared["env"] == [f"LD_LIBRARY_PATH={drv / 'lib64'}"]
    name_re = __import__("re").compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    assert all(name_re.match(n) for n in names)


def test_cdi_spec_refuses_what_is_not_a_driver_tree(tmp_path):
    dev, proc, drv = fake_driver(tmp_path, libcuda=False)
    with pytest.raises(ValueError, match="libcuda"):
        nodecfg.cdi_spec(str(drv), str(dev), str(proc))
    (dev / "nvidia1").unlink()
    with pytest.raises(ValueError, match="nvidia1 is missing"):
        nodecfg.cdi_spec(str(drv), str(dev), str(proc))
    with pytest.raises(ValueError, match="no GPUs"):
        nodecfg.cdi_spec(str(drv), str(dev), str(tmp_path / "nowhere"))


def test_cdi_spec_refuses_a_node_without_nvidia_uvm(tmp_path):
    # CUDA cannot start without /dev/nvidia-uvm: the spec says so at once.
    dev, proc, drv = fake_driver(tmp_path, uvm=False)
    with pytest.raises(ValueError, match="nvidia-uvm is missing"):
        nodecfg.cdi_spec(str(drv), str(dev), str(proc))


def test_cdi_spec_command_line(tmp_path, capsys):
    dev, proc, drv = fake_driver(tmp_path, gpus=((0, "GPU-x"),))
    assert nodecfg.main(["cdi", "--driver-root", str(drv), "--dev", str(dev), "--proc", str(proc)]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in spec["devices"]] == ["0", "GPU-x"]
    assert nodecfg.main(["cdi", "--driver-root", str(tmp_path), "--dev", str(dev), "--proc", str(proc)]) == 1
    assert "libcuda" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_cdi_spec_for_simulated_gpus_has_stand_in_device_nodes(tmp_path):
    node = {"status": {"gpus": [{"index": 0, "uuid": "GPU-sim-0"}, {"index": 1, "uuid": "GPU-sim-1"}]}}
    dev = tmp_path / "dev"
    spec = nodecfg.cdi_spec_simulated(node, str(dev))
    assert [d["name"] for d in spec["devices"]] == ["0", "GPU-sim-0", "1", "GPU-sim-1"]
    edits = spec["devices"][3]["containerEdits"]
    assert edits["env"] == ["VRAMFIT_SIMULATED_GPU=GPU-sim-1"]
    assert edits["deviceNodes"] == [{"path": "/dev/nvidia1", "hostPath": str(dev / "nvidia1")}]
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert "mounts" not in spec["containerEdits"] and "env" not in spec["containerEdits"]
    # Character devices with /dev/null's numbers: harmless to open.
    st = os.stat(dev / "nvidia1")
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    # Made again over what a previous run left.
    nodecfg.cdi_spec_simulated(node, str(dev))
    with pytest.raises(ValueError):
        nodecfg.cdi_spec_simulated({"status": {}}, str(dev))


def test_nri_plugin_config_names_its_log():
    import yaml

    assert yaml.safe_load(nodecfg.nri_plugin_config("/var/lib/n/nri-cdi.log")) == {"log": "/var/lib/n/nri-cdi.log"}


def read_archive(data: bytes):
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        files = {m.name: (t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()}
    manifest = json.loads(files["manifest.json"])[0]
    config = json.loads(files[manifest["Config"]])
    layer = files[manifest["Layers"][0]]
    return manifest, config, layer


def test_pause_image_is_a_docker_archive_ctr_can_import():
    data = nodecfg.docker_archive(nodecfg.PAUSE_IMAGE, nodecfg.pause_layer(b"\x7fELF pause"), ["/pause"], [])
    manifest, config, layer = read_archive(data)
    assert manifest["RepoTags"] == ["localhost/vramfit/pause:3.10"]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert manifest["Config"] == hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest() + ".json"
    assert (config["os"], config["architecture"], config["config"]["Entrypoint"]) == ("linux", "amd64", ["/pause"])
    with tarfile.open(fileobj=io.BytesIO(layer)) as t:
        m = t.getmember("pause")
        assert m.mode == 0o755 and t.extractfile(m).read() == b"\x7fELF pause"


def test_train_image_links_bin_and_libs_into_usr_and_is_reproducible():
    a = nodecfg.docker_archive(nodecfg.TRAIN_IMAGE, nodecfg.train_layer(), [], nodecfg.TRAIN_ENV)
    assert a == nodecfg.docker_archive(nodecfg.TRAIN_IMAGE, nodecfg.train_layer(), [], nodecfg.TRAIN_ENV)
    _, config, layer = read_archive(a)
    with tarfile.open(fileobj=io.BytesIO(layer)) as t:
        links = {m.name: m.linkname for m in t.getmembers() if m.issym()}
        assert t.getmember("tmp").mode == 0o1777
        assert b"root:x:0:0" in t.extractfile("etc/passwd").read()
    assert links == {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
    assert config["config"]["Env"][0].startswith("PATH=/opt/torch/.venv/bin:")


def test_venv_base_prefix(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.3\n")
    assert nodecfg.venv_base_prefix(str(venv)) is None
    (venv / "pyvenv.cfg").write_text("home = /root/.local/share/uv/python/cpython-3.12/bin\n")
    assert nodecfg.venv_base_prefix(str(venv)) == "/root/.local/share/uv/python/cpython-3.12"
    assert nodecfg.venv_base_prefix(str(tmp_path / "none")) is None


def test_demo_jobs_keep_the_examples_models_and_use_the_node_template():
    jobs = nodecfg.demo_jobs(str(REPO), "/opt/torch/.venv/bin/python", ["/opt/torch/.venv", "/usr"], steps=20)
    by = {j["metadata"]["name"]: j for j in jobs}
    assert set(by) == {"gpt2-small", "llama-1b", "resnet50", "gpt2-oom", "bypass", "gpt2-absorb"}
    absorb = by["gpt2-absorb"]["spec"]
    assert "--absorb" in absorb["template"]["spec"]["containers"][0]["command"]
    assert absorb["batch"] == by["gpt2-oom"]["spec"]["batch"] and absorb["memory"] == by["gpt2-oom"]["spec"]["memory"]
    llama = by["llama-1b"]["spec"]
    assert llama["model"]["gradientCheckpointing"] is True and llama["model"]["huggingFace"]["config"]["num_hidden_layers"] == 22
    assert by["gpt2-oom"]["spec"]["batch"]["micro"] == 32 and by["gpt2-oom"]["spec"]["memory"] == {"request": "24Gi"}
    pod = by["gpt2-small"]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    c = pod["containers"][0]
    assert (c["image"], c["imagePullPolicy"]) == (nodecfg.TRAIN_IMAGE, "Never")
    assert c["command"][:2] == ["/opt/torch/.venv/bin/python", str(REPO / "hack/node/train.py")]
    paths = [v["hostPath"]["path"] for v in pod["volumes"]]
    assert paths == ["/usr", "/opt/torch/.venv", str(REPO)]  # /usr once
    assert all(m["readOnly"] for m in c["volumeMounts"])
    assert {"name": "PYTHONPATH", "value": str(REPO / "python")} in c["env"]
    for j in jobs:
        assert j["metadata"]["namespace"] == "ml"
        assert j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


def test_cpu_demo_jobs():
    jobs = nodecfg.demo_jobs(str(REPO), "/usr/bin/python3", [], steps=2, gpu=False)
    assert [j["metadata"]["name"] for j in jobs] == ["cpu-gpt2-a", "cpu-gpt2-b"]
    assert "--device" in jobs[0]["spec"]["template"]["spec"]["containers"][0]["command"]


def cri_log(*events):
    return "".join(f"2026-12-01T08:00:00.0Z stdout F vramfit-train: {json.dumps(e)}\n" for e in events) + \
        "2026-12-01T08:00:00.0Z stderr F some other line\n"


def test_report_times_and_checks(tmp_path):
    logs = tmp_path / "logs"

    def pod(name, uid, exit_code, events, finished="2026-12-01T08:00:10Z"):
        d = logs / f"ml_{name}_{uid}" / "train"
        d.mkdir(parents=True)
        (d / "0.log").write_text(cri_log(*events))
        return {"metadata": {"name": name, "namespace": "ml", "uid": uid},
                "status": {"phase": "Succeeded" if exit_code == 0 else "Failed",
                           "containerStatuses": [{"state": {"terminated": {"exitCode": exit_code, "finishedAt": finished}}}]}}

    pods = {"items": [
        pod("gpt2-oom-a1", "u1", 42, [{"event": "start", "unixMs": 1500}, {"event": "oom", "unixMs": 4000}]),
        pod("gpt2-oom-a2", "u2", 0, [{"event": "step", "step": 1, "unixMs": 9000}, {"event": "done", "unixMs": 9500}]),
        pod("bypass-a1", "u3", 137, [{"event": "bypass", "unixMs": 3000}], finished="1970-01-01T00:00:05Z"),
        pod("bypass-a2", "u4", 0, [{"event": "step", "step": 1, "unixMs": 8000}]),
    ]}
    jobs = {"items": [
        {"metadata": {"name": "gpt2-oom"}, "status": {"phase": "Succeeded", "attempt": 2, "microBatch": 16, "gpu": "GPU-a",
                                                      "measuredPeakBytes": 5, "history": [{"attempt": 1, "microBatch": 32, "outcome": "OutOfMemory"}]}},
        {"metadata": {"name": "bypass"}, "status": {"phase": "Succeeded", "attempt": 2, "microBatch": 4, "gpu": "GPU-a",
                                                    "measuredPeakBytes": 5, "history": [{"attempt": 1, "microBatch": 8, "outcome": "OutOfMemory"}]}},
    ]}
    node = {"status": {"oomReports": [{"podName": "bypass-a1", "podNamespace": "ml"}]}}
    s = report.summarize(jobs, pods, node, apply_ms=1000, logs_root=logs)
    by = {j["name"]: j for j in s["jobs"]}
    # Attempt 1 never trained: apply to the first step of attempt 2.
    assert by["gpt2-oom"]["times"] == {"applyToFirstStepMs[a2]": 8000, "oomToNextFirstStepMs[a1->a2]": 5000}
    # Stopped by the agent: no oom event, the container's end counts.
    assert by["bypass"]["times"] == {"applyToFirstStepMs[a2]": 7000, "oomToNextFirstStepMs[a1->a2]": 3000}
    results = {n: ok for n, ok, _ in report.checks(s, gpu=True)}
    assert results["gpt2-oom: CUDA OOM, micro halved, then success"]
    assert results["bypass: stopped by the agent's watchdog, treated as OOM"]
    assert not results["jobs share one GPU"]  # only two jobs here
    node["status"]["oomReports"] = []
    s = report.summarize(jobs, pods, node, apply_ms=1000, logs_root=logs)
    assert not {n: ok for n, ok, _ in report.checks(s, gpu=True)}["bypass: stopped by the agent's watchdog, treated as OOM"]


def test_report_checks_the_gpu_reached_the_container(tmp_path):
    d = tmp_path / "ml_cpu-a1_u1" / "train"
    d.mkdir(parents=True)
    pods = {"items": [{"metadata": {"name": "cpu-a1", "namespace": "ml", "uid": "u1"}, "status": {"phase": "Succeeded"},
                       "spec": {"containers": [{"name": "train"}]}}]}
    jobs = {"items": [{"metadata": {"name": "cpu"}, "status": {"phase": "Succeeded", "attempt": 1, "gpu": "1"}}]}
    node = {"status": {"gpus": [{"index": 0, "uuid": "GPU-sim-0"}, {"index": 1, "uuid": "GPU-sim-1"}]}}
    cdi = {"devices": [
        {"name": n, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": f"/x/nvidia{i}"}]}}
        for i, u in ((0, "GPU-sim-0"), (1, "GPU-sim-1")) for n in (str(i), u)]}
    check = "cpu: its GPU through CDI, not privileged"
    default_caps = "00000000a80425fb"  # containerd's default set: no CAP_SYS_ADMIN

    def run(start, gpu, pods=pods):
        (d / "0.log").write_text(cri_log(dict({"event": "start", "unixMs": 1}, **start)))
        s = report.summarize(jobs, pods, node, apply_ms=0, logs_root=tmp_path, cdi=cdi)
        return dict((n, (ok, detail)) for n, ok, detail in report.checks(s, gpu=gpu))[check]

    good = {"devices": ["nvidia-uvm", "nvidia1", "nvidiactl"], "capEff": default_caps}
    assert run(good, gpu=True)[0]
    assert run(dict(good, simulatedGpu="GPU-sim-1"), gpu=False)[0]
    # The simulated GPU's variable names another GPU than the placed one.
    assert not run(dict(good, simulatedGpu="GPU-sim-0"), gpu=False)[0]
    # Another GPU's node, both nodes, or no nvidia-uvm (run 1 on the H200:
    # only the nvidiactl CUDA made itself).
    for devices in (["nvidia-uvm", "nvidia0", "nvidiactl"], ["nvidia-uvm", "nvidia0", "nvidia1", "nvidiactl"],
                    ["nvidia1", "nvidiactl"], ["nvidiactl"]):
        ok, detail = run(dict(good, devices=devices), gpu=True)
        assert not ok, devices
    # Privileged: every capability, or the pod asked for it.
    ok, detail = run(dict(good, capEff="000001ffffffffff"), gpu=True)
    assert not ok and "privileged" in detail
    priv = {"items": [dict(pods["items"][0], spec={"containers": [{"name": "train", "securityContext": {"privileged": True}}]})]}
    assert not run(good, gpu=True, pods=priv)[0]
    assert not run(dict(good, capEff=""), gpu=True)[0]


def test_report_checks_the_allocator(tmp_path):
    logs = tmp_path / "logs"

    def pod(name, uid, events, exit_code=0):
        d = logs / f"ml_{name}_{uid}" / "train"
        d.mkdir(parents=True)
        (d / "0.log").write_text(cri_log(*events))
        return {"metadata": {"name": name, "namespace": "ml", "uid": uid},
                "status": {"phase": "Succeeded" if exit_code == 0 else "Failed",
                           "containerStatuses": [{"state": {"terminated": {"exitCode": exit_code}}}]}}

    pods = {"items": [
        pod("gpt2-oom-a1", "u1", [{"event": "start", "enforcement": "allocator", "unixMs": 1},
                                  {"event": "oom", "budgetOom": True, "unixMs": 2}], 42),
        pod("gpt2-oom-a2", "u2", [{"event": "start", "enforcement": "allocator", "unixMs": 3}]),
        pod("resnet50-a1", "u3", [{"event": "start", "enforcement": "allocator", "unixMs": 1}]),
    ]}
    jobs = {"items": [
        {"metadata": {"name": "gpt2-oom"}, "status": {"phase": "Succeeded", "attempt": 2, "gpu": "0", "history": [
            {"attempt": 1, "outcome": "OutOfMemory", "microBatch": 32,
             "message": "CUDA out of memory: vramfit budget exceeded on GPU 0. Tried to allocate 384.00 MiB"},
            {"attempt": 2, "outcome": "Succeeded", "microBatch": 16}]}},
        {"metadata": {"name": "resnet50"}, "status": {"phase": "Succeeded", "attempt": 1, "gpu": "0"}},
    ]}
    node = {"status": {"gpus": [{"index": 0, "uuid": "GPU-a"}]}}

    def sample(*pods_):
        procs = [{"pid": 1, "podName": p, "allocator": {"policy": "pytorch", "budgetBytes": 8 << 30,
                                                       "peakReservedBytes": 1 << 30, "numOoms": 1}} for p in pods_]
        return {"status": {"gpus": [{"index": 0, "processes": procs + [{"pid": 9, "podName": "other-a1"}]}]}}

    def results(samples):
        s = report.summarize(jobs, pods, node, apply_ms=0, logs_root=logs, samples=samples)
        return s, {n: ok for n, ok, _ in report.checks(s, gpu=True)}

    s, r = results([sample("gpt2-oom-a1"), sample("gpt2-oom-a2", "resnet50-a1")])
    assert r["the allocator enforces every job's budget"]
    assert r["allocator figures reach the GpuNode"]
    assert r["gpt2-oom: the OOM is the allocator's budget error"]
    assert s["allocatorSeen"]["gpt2-oom-a2"]["samples"] == 1 and "other-a1" not in s["allocatorSeen"]
    # resnet50's process never showed allocator figures.
    assert not results([sample("gpt2-oom-a1")])[1]["allocator figures reach the GpuNode"]
    # A job under the memory fraction, or an OOM that was not the budget's.
    (logs / "ml_resnet50-a1_u3" / "train" / "0.log").write_text(cri_log({"event": "start", "enforcement": "fraction", "unixMs": 1}))
    (logs / "ml_gpt2-oom-a1_u1" / "train" / "0.log").write_text(cri_log({"event": "oom", "budgetOom": False, "unixMs": 2}))
    r = results([sample("gpt2-oom-a1", "resnet50-a1")])[1]
    assert not r["the allocator enforces every job's budget"]
    assert not r["gpt2-oom: the OOM is the allocator's budget error"]
    # The process's own word is gone with its pod: the controller's record decides.
    (logs / "ml_gpt2-oom-a1_u1" / "train" / "0.log").write_text(cri_log({"event": "start", "unixMs": 1}))
    assert results([sample("gpt2-oom-a1")])[1]["gpt2-oom: the OOM is the allocator's budget error"]
    # PyTorch's own OOM (the memory fraction, or the driver) is not the allocator's.
    jobs["items"][0]["status"]["history"][0]["message"] = "CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0"
    assert not results([sample("gpt2-oom-a1")])[1]["gpt2-oom: the OOM is the allocator's budget error"]


def test_report_reads_the_kept_logs_of_deleted_pods(tmp_path):
    # gpt2-oom-a1 is gone from the API (the controller deleted it), its log
    # folder kept by the demo; the OOM time comes from its oom event, and for
    # a pod without one (stopped by the watchdog) from the controller's event.
    d = tmp_path / "ml_gpt2-oom-a1_gone" / "train"
    d.mkdir(parents=True)
    (d / "0.log").write_text(cri_log({"event": "start", "unixMs": 1500}, {"event": "step", "step": 1, "unixMs": 2000},
                                     {"event": "oom", "budgetOom": True, "unixMs": 4000}))
    d2 = tmp_path / "ml_gpt2-oom-a2_u2" / "train"
    d2.mkdir(parents=True)
    (d2 / "0.log").write_text(cri_log({"event": "step", "step": 1, "unixMs": 9000}))
    d3 = tmp_path / "ml_bypass-a1_gone" / "train"
    d3.mkdir(parents=True)
    (d3 / "0.log").write_text(cri_log({"event": "bypass", "unixMs": 3000}))
    d4 = tmp_path / "ml_bypass-a2_u4" / "train"
    d4.mkdir(parents=True)
    (d4 / "0.log").write_text(cri_log({"event": "step", "step": 1, "unixMs": 12000}))
    pods = {"items": [{"metadata": {"name": "gpt2-oom-a2", "namespace": "ml", "uid": "u2"}, "status": {"phase": "Succeeded"}},
                      {"metadata": {"name": "bypass-a2", "namespace": "ml", "uid": "u4"}, "status": {"phase": "Succeeded"}}]}
    jobs = {"items": [{"metadata": {"name": "gpt2-oom", "namespace": "ml"}, "status": {"phase": "Succeeded", "attempt": 2}},
                      {"metadata": {"name": "bypass", "namespace": "ml"}, "status": {"phase": "Succeeded", "attempt": 2}}]}
    events = {"items": [{"reason": "OutOfMemory", "message": "attempt 1 at micro-batch 8: the node agent stopped the pod",
                         "firstTimestamp": "1970-01-01T00:00:05Z", "involvedObject": {"kind": "TrainingJob", "name": "bypass"}}]}
    s = report.summarize(jobs, pods, {"status": {}}, apply_ms=1000, logs_root=tmp_path, k8s_events=events)
    by = {j["name"]: j for j in s["jobs"]}
    assert [a["pod"] for a in by["gpt2-oom"]["attempts"]] == ["gpt2-oom-a1", "gpt2-oom-a2"]
    assert by["gpt2-oom"]["attempts"][0]["podDeleted"] and by["gpt2-oom"]["attempts"][0]["budgetOom"] is True
    assert by["gpt2-oom"]["times"] == {"applyToFirstStepMs": 1000, "oomToNextFirstStepMs[a1->a2]": 5000}
    # bypass-a1 never trained: apply to the first step of attempt 2.
    assert by["bypass"]["times"] == {"applyToFirstStepMs[a2]": 11000, "oomToNextFirstStepMs[a1->a2]": 7000}


def test_report_names_a_first_step_that_is_not_attempt_one(tmp_path):
    d = tmp_path / "ml_gpt2-oom-a3_u3" / "train"
    d.mkdir(parents=True)
    (d / "0.log").write_text(cri_log({"event": "step", "step": 1, "unixMs": 9000}))
    pods = {"items": [{"metadata": {"name": "gpt2-oom-a3", "namespace": "ml", "uid": "u3"}, "status": {"phase": "Succeeded"}}]}
    jobs = {"items": [{"metadata": {"name": "gpt2-oom"}, "status": {"phase": "Succeeded", "attempt": 3}}]}
    s = report.summarize(jobs, pods, {"status": {}}, apply_ms=1000, logs_root=tmp_path)
    assert s["jobs"][0]["times"] == {"applyToFirstStepMs[a3]": 8000}


def test_privileged_fallback_only_when_asked(monkeypatch):
    monkeypatch.delenv("VRAMFIT_NODE_PRIVILEGED", raising=False)
    plain = nodecfg.node_template(["python3"], "/repo")
    assert "securityContext" not in plain["spec"]["containers"][0]
    monkeypatch.setenv("VRAMFIT_NODE_PRIVILEGED", "1")
    priv = nodecfg.node_template(["python3"], "/repo")
    assert priv["spec"]["containers"][0]["securityContext"] == {"privileged": True}


def test_report_checks_the_kubelet_runs_as_its_node():
    check = "the kubelet runs as its node, not as the admin"

    def result(username, groups, can_create="no"):
        summary = {"jobs": [], "gpuNode": {}, "node": "vm",
                   "kubeletIdentity": {"userInfo": {"username": username, "groups": groups},
                                       "canCreateNamespaces": can_create}}
        return dict((n, ok) for n, ok, _ in report.checks(summary, gpu=False))[check]

    assert result("system:node:vm", ["system:nodes", "system:authenticated"])
    assert not result("system:node:other", ["system:nodes", "system:authenticated"])
    assert not result("vramfit-admin", ["system:masters", "system:authenticated"], "yes")
    assert not result("system:node:vm", ["system:nodes", "system:masters"])
    assert not result("system:node:vm", ["system:nodes"], "yes")
    # Not measured (an older demo): no check at all.
    assert all(n != check for n, _, _ in report.checks({"jobs": [], "gpuNode": {}}, gpu=False))


def test_report_checks_the_absorbed_oom(tmp_path):
    d = tmp_path / "ml_gpt2-absorb-a1_u1" / "train"
    d.mkdir(parents=True)
    (d / "0.log").write_text(cri_log({"event": "absorbed", "fromMicro": 32, "toMicro": 16, "unixMs": 1}))
    pods = {"items": [{"metadata": {"name": "gpt2-absorb-a1", "namespace": "ml", "uid": "u1"}, "status": {"phase": "Succeeded"}}]}
    status = {"phase": "Succeeded", "attempt": 1, "gpu": "0",
              "absorbedOoms": [{"fromMicro": 32, "toMicro": 16, "fromAccum": 2, "toAccum": 4, "time": "t"}]}
    jobs = {"items": [{"metadata": {"name": "gpt2-absorb"}, "status": status}]}
    events = {"items": [{"reason": "OomAbsorbed", "involvedObject": {"kind": "TrainingJob", "name": "gpt2-absorb"}},
                        {"reason": "OomAbsorbed", "involvedObject": {"kind": "TrainingJob", "name": "other"}}]}
    shape = {"microBatch": 16, "gradAccum": 4, "absorbedOoms": [{"fromMicro": 32, "toMicro": 16}]}
    sample = {"status": {"gpus": [{"index": 0, "processes": [{"podName": "gpt2-absorb-a1", "shape": shape}]}]}}
    recorded = "gpt2-absorb: OOMs absorbed in the process, recorded by the controller"
    carried = "gpt2-absorb: the GpuNode carried the process's shape"

    def results(jobs=jobs, events=events, samples=(sample,)):
        s = report.summarize(jobs, pods, {"status": {}}, apply_ms=0, logs_root=tmp_path, samples=list(samples), k8s_events=events)
        return {n: ok for n, ok, _ in report.checks(s, gpu=True)}

    r = results()
    assert r[recorded] and r[carried]
    # No event from the controller, or the event of another job only.
    assert not results(events={"items": events["items"][1:]})[recorded]
    # A restart instead (attempt 2), or nothing absorbed in the status.
    assert not results(jobs={"items": [{"metadata": {"name": "gpt2-absorb"}, "status": dict(status, attempt=2)}]})[recorded]
    assert not results(jobs={"items": [{"metadata": {"name": "gpt2-absorb"}, "status": dict(status, absorbedOoms=[])}]})[recorded]
    # The agent never showed the shape with its absorbed OOMs.
    plain = {"status": {"gpus": [{"index": 0, "processes": [{"podName": "gpt2-absorb-a1", "shape": dict(shape, absorbedOoms=[])}]}]}}
    assert not results(samples=[plain])[carried]
    assert results(samples=[sample, plain])[carried]


def test_oci_devices_reads_ctr_container_info():
    train = {"Labels": {"io.kubernetes.container.name": "train", "io.kubernetes.pod.name": "gpt2-a1"},
             "Spec": {"process": {"capabilities": {"effective": ["CAP_CHOWN"]}},
                      "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
                                "resources": {"devices": [{"allow": False, "access": "rwm"},
                                                          {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]}}}}
    sandbox = {"Labels": {"io.kubernetes.container.name": "POD"}, "Spec": {}}
    text = json.dumps(sandbox, indent=2) + "\n" + json.dumps(train, indent=2) + "\n"
    assert nodecfg.oci_devices(text) == [
        "gpt2-a1: devices ['/dev/nvidia0 c 195:0']; allowed ['c 195:0 rwm']; CAP_SYS_ADMIN False"
    ]


# --- report.py: operating the release while the jobs run ------------------------------


def _tj(name, ns="team-a", phase="Succeeded", attempt=1, history=None):
    return {"metadata": {"name": name, "namespace": ns},
            "status": {"phase": phase, "attempt": attempt, "history": history or []}}


def _rec(ms, kind, name, ns="team-a", **kw):
    return dict({"ms": ms, "type": "MODIFIED", "kind": kind, "name": name, "namespace": ns}, **kw)


def test_operations_every_job_ends_once():
    jobs = {"items": [_tj("a"), _tj("b")]}
    recs = [_rec(1, "TrainingJob", "a", phase="Running"), _rec(2, "TrainingJob", "a", phase="Succeeded"),
            _rec(1, "TrainingJob", "b", phase="Running"), _rec(3, "TrainingJob", "b", phase="Succeeded")]
    ok, detail = report.jobs_once_check(jobs, recs)
    assert ok, detail
    # Running again after Succeeded: a controller that took over ran it twice.
    ok, detail = report.jobs_once_check(jobs, recs + [_rec(4, "TrainingJob", "b", phase="Running")])
    assert not ok and "team-a/b: Running -> Succeeded -> Running" in detail
    ok, detail = report.jobs_once_check({"items": [_tj("a", phase="Failed")]}, recs)
    assert not ok and "ended Failed" in detail


def test_operations_one_pod_per_attempt():
    jobs = {"items": [_tj("a", attempt=2, history=[{"attempt": 1}, {"attempt": 2}])]}
    pods = [_rec(1, "Pod", "a-a1", job="a", attempt="1", uid="u1", type="ADDED"),
            _rec(2, "Pod", "a-a1", job="a", attempt="1", uid="u1"),
            _rec(3, "Pod", "a-a2", job="a", attempt="2", uid="u2", type="ADDED")]
    ok, detail = report.attempt_pods_check(jobs, pods)
    assert ok and "2 training pods for 2 attempts" in detail, detail
    # The same attempt's pod deleted and created again: two UIDs.
    ok, detail = report.attempt_pods_check(jobs, pods + [_rec(4, "Pod", "a-a2", job="a", attempt="2", uid="u3")])
    assert not ok and "attempt 2: 2 pods" in detail
    # An attempt more than the status says, or a history attempt twice.
    ok, detail = report.attempt_pods_check({"items": [_tj("a", attempt=1)]}, pods)
    assert not ok and "pods of attempts ['1', '2'], status.attempt 1" in detail
    ok, detail = report.attempt_pods_check(
        {"items": [_tj("a", attempt=2, history=[{"attempt": 1}, {"attempt": 1}])]}, pods)
    assert not ok and "history attempts [1, 1]" in detail


def test_operations_committed_never_over_capacity():
    gn = {"status": {"gpus": [{"index": 0, "totalBytes": 100}, {"index": 1, "totalBytes": 100}]}}
    samples = [{"status": dict(gn["status"], allocation={"committedBytes": 120})}]
    recs = [_rec(1, "TrainingJob", "a", phase="Placed", gpu="0", budgetBytes=60),
            _rec(2, "TrainingJob", "b", phase="Running", gpu="1", budgetBytes=60),
            _rec(3, "TrainingJob", "a", phase="Succeeded", gpu="0", budgetBytes=60),
            _rec(4, "TrainingJob", "c", phase="Placed", gpu="0", budgetBytes=90)]
    ok, detail = report.committed_check(recs, samples, gn)
    assert ok and "GPU 0: at most" in detail, detail
    # Two jobs holding GPU 0 at once past its memory.
    ok, detail = report.committed_check(recs[:2] + [recs[3]], samples, gn)
    assert not ok and "GPU 0" in detail
    over = [{"status": dict(gn["status"], allocation={"committedBytes": 201}, heartbeat="t")}]
    ok, detail = report.committed_check(recs, over, gn)
    assert not ok and "committedBytes 201 > 200" in detail
    # A GpuNode whose GPUs went (an agent without NVML): the samples' GPUs.
    ok, detail = report.committed_check(recs, samples, {"status": {}})
    assert ok and "GPU 0: at most" in detail and "(of -)" not in detail, detail


def test_operations_events_once_each():
    jobs = {"items": [_tj("a", attempt=2)]}

    def ev(reason, count=None):
        e = {"involvedObject": {"kind": "TrainingJob", "name": "a", "namespace": "team-a"}, "reason": reason}
        if count:
            e["count"] = count
        return e

    ok, detail = report.events_check(jobs, {"items": [ev("Placed"), ev("Placed"), ev("Succeeded"), ev("Retrying")]})
    assert ok and "a Placed x2, Succeeded x1" in detail, detail
    ok, detail = report.events_check(jobs, {"items": [ev("Placed", 2), ev("Succeeded", 2)]})
    assert not ok and "2 Succeeded (want 1)" in detail
    ok, detail = report.events_check(jobs, {"items": [ev("Placed", 3), ev("Succeeded"), ev("PodRejected")]})
    assert not ok and "3 Placed (want 2)" in detail and "1 PodRejected" in detail
    assert report.events_check(jobs, None) == (False, "no events recorded")


def test_operations_checks_fail_when_nothing_was_done():
    jobs = {"items": [_tj("a")]}
    recs = [_rec(1, "TrainingJob", "a", phase="Succeeded"), _rec(1, "Pod", "a-a1", job="a", attempt="1", uid="u")]
    events = {"items": [{"involvedObject": {"kind": "TrainingJob", "name": "a", "namespace": "team-a"}, "reason": r}
                        for r in ("Placed", "Succeeded")]}
    gn = {"status": {"gpus": [{"index": 0, "totalBytes": 100}]}}
    done = report.operations_checks({"applyMs": 0, "leader": {"ms": 2000}, "upgrade": {"ms": 5000}}, jobs, recs,
                                    [], gn, events)
    assert [ok for _, ok, _ in done] == [True, True, False, True]   # no sample and no placement: nothing to judge
    assert "across the leader's pod deleted at 2.0 s, helm upgrade at 5.0 s after the apply" in done[0][0]
    nothing = report.operations_checks({"applyMs": 0}, jobs, recs, [], gn, events)
    assert all(ok is False and "no operation was done" in d for _, ok, d in nothing)


def test_peaks_kept_across_the_agents_replacement():
    def snap(peak, pid=7, measured=5, phase="Running", attempt=1):
        proc = {"pid": pid, "usedBytes": 1, "peakBytes": peak, "podName": "a-a1", "podUid": "u1"}
        return {"gpunode": {"status": {"gpus": [{"uuid": "GPU-1", "processes": [proc]}]}},
                "jobs": {"items": [{"metadata": {"name": "a", "namespace": "team-a"},
                                    "status": {"phase": phase, "measuredPeakBytes": measured, "attempt": attempt}}]}}

    ok, detail = report.peaks_kept(snap(10 << 30), snap(11 << 30, measured=6))
    assert ok and "peaks of 1 processes kept" in detail and "measuredPeakBytes kept" in detail, detail
    ok, detail = report.peaks_kept(snap(10 << 30), snap(2 << 30))
    assert not ok and "a-a1 (pid 7): peak 10.0 -> 2.0 GiB" in detail
    ok, detail = report.peaks_kept(snap(10 << 30), snap(10 << 30, measured=4))
    assert not ok and "measuredPeakBytes 5 -> 4" in detail
    # A later attempt of the job starts its own peak.
    ok, detail = report.peaks_kept(snap(10 << 30), snap(10 << 30, measured=None, attempt=2))
    assert ok and "measuredPeakBytes kept" not in detail, detail
    # The process gone (another pid) by the new agent's first status: nothing to compare.
    ok, detail = report.peaks_kept(snap(10 << 30), snap(10 << 30, pid=8))
    assert not ok and "nothing to compare" in detail


def test_elastic_checks_of_the_pair():
    def tj(name, micro, accum, elastic, phase="Succeeded"):
        placement = {"node": "vm", "microBatch": micro}
        if elastic:
            placement["elastic"] = {"preferredMicroBatch": 32, "relativeStepTime": 1.06}
        return {"metadata": {"name": name}, "status": {"phase": phase, "microBatch": micro, "gradAccum": accum,
                                                         "placement": placement}}

    def log(start, end, micro, accum, loss):
        return "".join(f"2026-12-04T08:00:00Z stdout F vramfit-train: {json.dumps(e)}\n" for e in (
            {"event": "start", "unixMs": start},
            {"event": "done", "unixMs": end, "micro": micro, "accum": accum, "evalLoss": loss}))

    event = {"involvedObject": {"name": "elastic-b"}, "reason": "ElasticShape",
             "message": "preferred 32x2 needs 75.9 GiB per GPU, placed 16x4 in 39.0 GiB, predicted 1.04x step time"}
    jobs = {"items": [tj("elastic-a", 32, 2, False), tj("elastic-b", 16, 4, True)]}
    logs = {"elastic-a": log(1000, 9000, 32, 2, 10.5), "elastic-b": log(2000, 12000, 16, 4, 10.5003)}

    def run(jobs=jobs, events={"items": [event]}, logs=logs):
        return {n.split(": ", 1)[1].split(" (")[0]: ok for n, ok, _ in report.elastic_checks(jobs, events, logs)}

    assert all(run().values()), report.elastic_checks(jobs, {"items": [event]}, logs)
    # Each decision fails its own check.
    assert not run(logs=dict(logs, **{"elastic-b": log(9500, 12000, 16, 4, 10.5003)}))[
        "both trained at the same time on the GPU"]
    assert not run(logs=dict(logs, **{"elastic-b": log(2000, 12000, 16, 4, 10.6)}))[
        "the same held-out loss at both shapes"]
    assert not run(jobs={"items": [tj("elastic-a", 32, 2, False), tj("elastic-b", 32, 2, False)]})[
        "one at its preferred shape, the other smaller with the same global batch"]
    assert not run(jobs={"items": [tj("elastic-a", 32, 2, False), tj("elastic-b", 16, 2, True)]})[
        "one at its preferred shape, the other smaller with the same global batch"]
    assert not run(events={"items": []})[
        "an ElasticShape event with the preferred and chosen shapes and the step time"]
    assert not run(logs=dict(logs, **{"elastic-b": log(2000, 12000, 32, 2, 10.5003)}))[
        "each process trained at its placement's shape"]
    assert not run(jobs={"items": [tj("elastic-a", 32, 2, False), tj("elastic-b", 16, 4, True, "Failed")]})[
        "both jobs Succeeded"]
