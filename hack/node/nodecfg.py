#!/usr/bin/env python3
"""The GPU node's generated files: containerd and kubelet configuration, the
CNI network, the CDI spec of the GPUs, and the two local images.

Only the standard library, so it runs unchanged on the development machine
and on the GPU node (whatever python3 is there). hack/gpunode.sh calls it;
hack/node/test_nodecfg.py tests it (CI runs them).

    nodecfg.py containerd --dir D --runc R --sandbox-image I     config.toml on stdout
    nodecfg.py kubelet --dir D --endpoint E --node N ...         KubeletConfiguration on stdout
    nodecfg.py kubeconfig --server S --pki D                     the kubelet's kubeconfig (node certificate)
    nodecfg.py cni                                               the loopback-only network
    nodecfg.py cni --bridge B --subnet S --data-dir D            the pod network: loopback, bridge, host-local
    nodecfg.py cni --isolated --subnet S --data-dir D            lo alone, an address no interface carries
    nodecfg.py cdi [--driver-root /usr/local/nvidia] [--dev /dev] [--proc /proc/driver/nvidia]
    nodecfg.py cdi-simulated --dev D < gpunode.json              the same for a simulating agent's GPUs
    nodecfg.py nri-config --log FILE                             the NRI plugin's configuration
    nodecfg.py image pause|train --out FILE [--pause BIN]        a docker-archive tarball
    nodecfg.py oci-netns < ctr containers info ...                the pods' network namespaces (for down)
    nodecfg.py jobs --repo R --python P [--root D]... [--cpu]    the demo's TrainingJobs (a List)
               [--image I --namespaces A,B]                     ... from the training image, in tenant namespaces
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import ipaddress
import json
import os
import re
import stat
import sys
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# The images are local: imported with `ctr images import`, never pulled.
PAUSE_IMAGE = "localhost/vramfit/pause:3.10"
TRAIN_IMAGE = "localhost/vramfit/train:dev"
#: Where the training containers see the node's libvramfit_alloc.so.
ALLOCATOR_MOUNT = "/opt/vramfit/lib/libvramfit_alloc.so"
CDI_KIND = "nvidia.com/gpu"
NRI_PLUGIN = "10-vramfit-cdi"


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _toml_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def containerd_config(
    state_dir: str, runc: str, sandbox_image: str = PAUSE_IMAGE, log_level: str = "info"
) -> str:
    """containerd 2.x configuration (version 3) for a kubelet on this node.

    Everything lives under state_dir so the node leaves the host's
    /var/lib/containerd and /etc alone. restrict_oom_score_adj: the GPU
    machine lacks CAP_SYS_RESOURCE, so runc may only raise oom_score_adj
    (without it every sandbox fails: "nsexec: failed to update
    /proc/self/oom_score_adj: Permission denied"). cgroupfs, not systemd:
    there is no systemd. CDI on, reading only this node's spec folder. NRI on,
    with the CDI plugin (vramfit-nri-cdi) that maps pod annotations to CDI
    devices.
    """
    d = state_dir.rstrip("/")
    rt = "plugins.'io.containerd.cri.v1.runtime'"
    img = "plugins.'io.containerd.cri.v1.images'"
    return f"""version = 3
root = {_toml_str(d + "/containerd/root")}
state = {_toml_str(d + "/containerd/state")}

[grpc]
  address = {_toml_str(d + "/containerd.sock")}

[ttrpc]
  address = {_toml_str(d + "/containerd.sock.ttrpc")}

[debug]
  level = {_toml_str(log_level)}

[{img}]
  snapshotter = "overlayfs"
  [{img}.pinned_images]
    sandbox = {_toml_str(sandbox_image)}

[{rt}]
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = {_toml_list([d + "/cdi"])}
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  [{rt}.containerd]
    default_runtime_name = "runc"
    [{rt}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{rt}.containerd.runtimes.runc.options]
        BinaryName = {_toml_str(runc)}
        SystemdCgroup = false
  [{rt}.cni]
    bin_dirs = {_toml_list([d + "/cni/bin"])}
    conf_dir = {_toml_str(d + "/cni/net.d")}
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = {_toml_str(d + "/nri/nri.sock")}
  plugin_path = {_toml_str(d + "/nri/plugins")}
  plugin_config_path = {_toml_str(d + "/nri/conf.d")}
"""


def kubelet_config(
    state_dir: str,
    endpoint: str,
    healthz_port: int,
    port: int,
    cpus: int,
    reserved_cpus: str = "0",
    cpu_manager: str = "static",
    client_ca: Optional[str] = None,
) -> str:
    """KubeletConfiguration (JSON, which the kubelet reads as YAML).

    Registered against the local API server (the kubeconfig is a flag),
    cgroupfs driver to match containerd, swap tolerated, serving on loopback
    only, no read-only port. The static CPU manager gives Guaranteed pods
    with whole CPUs exclusive cores; CPU reservedSystemCPUs (default "0") is
    kept for the control plane, containerd, the kubelet and the agent. Eviction
    thresholds are low: the node is a single machine with a small disk, and
    evicting a training pod would look like a failure that is not an OOM.
    """
    if cpu_manager not in ("static", "none"):
        raise ValueError(f"cpu manager policy must be static or none, not {cpu_manager!r}")
    if cpu_manager == "static" and cpus < 2:
        raise ValueError("the static CPU manager needs at least 2 CPUs (one is reserved)")
    d = state_dir.rstrip("/")
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": endpoint,
        "failSwapOn": False,
        "failCgroupV1": False,
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": client_ca} if client_ca else {},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "staticPodPath": d + "/kubelet/manifests",
        "resolvConf": "/etc/resolv.conf" if os.path.exists("/etc/resolv.conf") else "",
        "cpuManagerPolicy": cpu_manager,
        "evictionHard": {
            "memory.available": "200Mi",
            "nodefs.available": "100Mi",
            "imagefs.available": "100Mi",
            "nodefs.inodesFree": "1%",
        },
        "evictionPressureTransitionPeriod": "10s",
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "localStorageCapacityIsolation": True,
    }
    if cpu_manager == "static":
        config["reservedSystemCPUs"] = reserved_cpus
    return json.dumps(config, indent=2) + "\n"


def node_kubeconfig(server: str, ca: str, cert: str, key: str, node: str) -> str:
    """The kubelet's own kubeconfig: the node's client certificate (user
    system:node:<node>, group system:nodes, `hack/controlplane.sh
    node-cert`), which the API server's Node authorizer and NodeRestriction
    limit to this node's objects. JSON, which the kubelet reads as YAML."""
    user = f"system:node:{node}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "vramfit-local", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"client-certificate": cert, "client-key": key}}],
        "contexts": [{"name": "node", "context": {"cluster": "vramfit-local", "user": user}}],
        "current-context": "node",
    }
    return json.dumps(config, indent=2) + "\n"


def cni_config() -> str:
    """A loopback-only network: every pod that is not on the host network gets
    its own network namespace with `lo` up and nothing else. No bridge, no
    NAT: the GPU machine has no iptables and ip_forward = 0, and the training
    pods need no network (they use hostNetwork where they do). Its presence
    is what makes containerd report NetworkReady and the kubelet the node Ready.
    """
    return (
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "vramfit-lo",
                "plugins": [{"type": "loopback"}],
            },
            indent=2,
        )
        + "\n"
    )


def cni_bridge_config(bridge: str, subnet: str, data_dir: str) -> str:
    """The pod network of `gpunode.sh up --pod-network`: each pod gets a veth
    pair, its `eth0` an address of `subnet`, the other end on the Linux
    bridge `bridge`, whose address is the subnet's first (the pods' gateway;
    vramfit-podnet gives it to the bridge, and the API server listens there).
    The upstream `bridge` and `host-local` plugins do it through netlink,
    without the `ip` binary. isGateway stays false, since the plugin would
    then turn on net.ipv4.ip_forward, and ipMasq false (iptables): no
    forwarding, no NAT; the pods reach the host and each other, nothing else.
    """
    net = ipaddress.ip_network(subnet)
    gateway = str(next(net.hosts()))
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": "vramfit-bridge",
        "plugins": [
            {"type": "loopback"},
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": False,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(net), "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0", "gw": gateway}],
                    "dataDir": data_dir,
                },
            },
        ],
    }, indent=2) + "\n"


def cni_isolated_config(subnet: str, data_dir: str) -> str:
    """Where no bridge can be made: the pod keeps `lo` alone (the loopback
    plugin) and hack/node/cni-isolated.py reports an address of `subnet` that
    no interface carries, which containerd wants for every sandbox."""
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": "vramfit-isolated",
        "plugins": [
            {"type": "loopback"},
            {"type": "vramfit-isolated", "subnet": str(ipaddress.ip_network(subnet)), "dataDir": data_dir},
        ],
    }, indent=2) + "\n"


# --- CDI ------------------------------------------------------------------


@dataclasses.dataclass
class Gpu:
    minor: int
    uuid: str
    bus: str


def _gpus_from_proc(proc_root: Path) -> List[Gpu]:
    """GPUs from /proc/driver/nvidia/gpus/<bus>/information (the driver's own
    list: "Device Minor" and "GPU UUID" lines)."""
    gpus = []
    root = proc_root / "gpus"
    if not root.is_dir():
        return gpus
    for entry in sorted(root.iterdir()):
        info = entry / "information"
        if not info.is_file():
            continue
        fields = {}
        for line in info.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        try:
            minor = int(fields["Device Minor"])
            uuid = fields["GPU UUID"]
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{info}: no usable 'Device Minor' and 'GPU UUID' lines") from exc
        gpus.append(Gpu(minor=minor, uuid=uuid, bus=entry.name))
    return sorted(gpus, key=lambda g: g.minor)


def cdi_spec(
    driver_root: Optional[str] = "/usr/local/nvidia",
    dev: str = "/dev",
    proc: str = "/proc/driver/nvidia",
    uuids: Optional[Dict[int, str]] = None,
    extra_env: Optional[Dict[str, List[str]]] = None,
) -> dict:
    """A CDI spec (kind nvidia.com/gpu) for the GPUs of this machine.

    One device per GPU, named both by index (device minor) and by UUID, each
    with its /dev/nvidiaN; every device also brings the shared control nodes
    (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools,
    /dev/nvidia-modeset where present) and the driver tree's bin, lib and
    lib64 folders, bind-mounted read-only at the same paths, with
    LD_LIBRARY_PATH pointing at the libraries. Each node is `path` (in the
    container, always under /dev) and `hostPath` (under `dev` on this
    machine); device numbers are left out: the CDI library reads them from
    the host's node when it injects a device.

    `uuids` maps a minor to a UUID where /proc/driver/nvidia is not there
    (tests, or the simulated GPUs of a machine without any). `driver_root`
    None: no driver tree (simulated GPUs). `extra_env` adds variables to the
    device of a UUID.
    """
    dev_root = Path(dev)
    gpus = _gpus_from_proc(Path(proc))
    if uuids:
        gpus = [Gpu(minor=m, uuid=u, bus="") for m, u in sorted(uuids.items())]
    if not gpus:
        raise ValueError(f"no GPUs found under {proc}/gpus (is the NVIDIA driver loaded?)")
    for g in gpus:
        if not (dev_root / f"nvidia{g.minor}").exists():
            raise ValueError(f"GPU {g.uuid} has minor {g.minor} but {dev_root}/nvidia{g.minor} is missing")
    if not (dev_root / "nvidiactl").exists():
        raise ValueError(f"{dev_root}/nvidiactl is missing")
    if not (dev_root / "nvidia-uvm").exists():
        # CUDA needs it; the driver creates it when the nvidia-uvm module loads.
        raise ValueError(f"{dev_root}/nvidia-uvm is missing (is the nvidia-uvm module loaded?)")

    def node(name: str) -> dict:
        return {"path": "/dev/" + name, "hostPath": str(dev_root / name)}

    mounts: List[dict] = []
    env: List[str] = []
    if driver_root is not None:
        driver = Path(driver_root)
        libdirs = [d for d in ("lib64", "lib") if (driver / d).is_dir()]
        if not any((driver / d / "libcuda.so.1").exists() for d in libdirs):
            raise ValueError(f"no libcuda.so.1 under {driver}/lib64 or {driver}/lib: not a driver tree")
        for d in ["bin"] + libdirs:
            if (driver / d).is_dir():
                path = str(driver / d)
                mounts.append(
                    {
                        "hostPath": path,
                        "containerPath": path,
                        "type": "bind",
                        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
                    }
                )
        # PATH stays the image's (which lists /usr/local/nvidia/bin): a second
        # PATH in the process environment would be ambiguous.
        env = ["LD_LIBRARY_PATH=" + ":".join(str(driver / d) for d in libdirs)]
    shared = [node(n) for n in SHARED_NODES if (dev_root / n).exists()]
    devices = []
    for g in gpus:
        edits: dict = {"deviceNodes": [node(f"nvidia{g.minor}")]}
        if extra_env and extra_env.get(g.uuid):
            edits["env"] = list(extra_env[g.uuid])
        for name in (str(g.minor), g.uuid):
            devices.append({"name": name, "containerEdits": edits})
    common: dict = {"deviceNodes": shared}
    if mounts:
        common["mounts"] = mounts
    if env:
        common["env"] = env
    return {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": devices,
        "containerEdits": common,
    }


#: The driver's nodes every GPU container gets, where present.
SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def fake_dev(gpu_node: dict, dev: str) -> Dict[int, str]:
    """Stand-ins for the device nodes of a simulating agent's GPUs (a machine
    without GPUs): `dev`/nvidia<index>, nvidiactl and nvidia-uvm, each a
    character device with /dev/null's numbers (1:3), so the CDI injection of
    real device nodes is exercised and a process that opens one gets nothing.
    Returns index -> UUID."""
    gpus = (gpu_node.get("status") or {}).get("gpus") or []
    if not gpus:
        raise ValueError("the GpuNode reports no GPUs")
    root = Path(dev)
    root.mkdir(parents=True, exist_ok=True)
    names = [f"nvidia{int(g['index'])}" for g in gpus] + ["nvidiactl", "nvidia-uvm"]
    for name in names:
        path = root / name
        if path.exists() or path.is_symlink():
            path.unlink()
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(path, 0o666)
    return {int(g["index"]): g["uuid"] for g in gpus}


def cdi_spec_simulated(gpu_node: dict, dev: str) -> dict:
    """A CDI spec for the GPUs a simulating agent reports (`vramfit-agent run
    --simulate`, on a machine without GPUs): the same names and device nodes
    as cdi_spec (stand-ins under `dev`, see fake_dev), no driver tree, and
    VRAMFIT_SIMULATED_GPU=<uuid> per device, so a CPU pod goes through the
    same NRI and CDI path as a GPU pod."""
    uuids = fake_dev(gpu_node, dev)
    return cdi_spec(
        driver_root=None,
        dev=dev,
        proc="/nonexistent",
        uuids=uuids,
        extra_env={u: [f"VRAMFIT_SIMULATED_GPU={u}"] for u in uuids.values()},
    )


def nri_plugin_config(log: str, agent_namespaces: Sequence[str] = ()) -> str:
    """vramfit-nri-cdi's NRI configuration (plugin_config_path/10-vramfit-cdi.conf):
    the file it logs each container's devices to (containerd gives the plugins
    it starts no output), and the namespaces whose pods may ask for GPUs with
    cdi.k8s.io annotations (the chart's agent with gpuAccess cdi)."""
    text = "log: " + json.dumps(log) + "\n"
    if agent_namespaces:
        text += "agentNamespaces: " + json.dumps(list(agent_namespaces)) + "\n"
    return text


# --- images -----------------------------------------------------------------


def _tar_add(tar: tarfile.TarFile, name: str, kind: str, data: bytes = b"", mode: int = 0o755, target: str = ""):
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = mode
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif kind == "link":
        info.type = tarfile.SYMTYPE
        info.linkname = target
        info.mode = 0o777
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _layer(entries: List[tuple]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            _tar_add(tar, *entry)
    return buf.getvalue()


def pause_layer(pause_binary: bytes) -> bytes:
    return _layer([("pause", "file", pause_binary, 0o755)])


TRAIN_ENV = [
    "PATH=/opt/torch/.venv/bin:/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "VIRTUAL_ENV=/opt/torch/.venv",
    "PYTHONUNBUFFERED=1",
    "PYTHONDONTWRITEBYTECODE=1",
    "HOME=/root",
    "HF_HUB_OFFLINE=1",
    "TRANSFORMERS_OFFLINE=1",
    "HF_HOME=/tmp/hf",
    "TORCHINDUCTOR_CACHE_DIR=/tmp/inductor",
]


def train_layer() -> bytes:
    """The training image's root: no files of its own beyond /etc basics. The
    pod mounts the node's /usr (the interpreter, libc) and its Python
    environment /opt/torch/.venv read-only, and the repo's python/ (the
    vramfit helper) at /opt/vramfit/python; /bin, /lib, /lib64 and /sbin are
    links into usr/, as on a merged-/usr system, so /lib64/ld-linux-x86-64.so.2
    and /bin/sh resolve through the mounted /usr."""
    entries: List[tuple] = []
    for d in ("usr", "etc", "root", "tmp", "var", "var/tmp", "opt", "proc", "sys", "dev", "run", "workspace"):
        entries.append((d, "dir", b"", 0o1777 if d in ("tmp", "var/tmp") else 0o755))
    for link in ("bin", "lib", "lib64", "sbin"):
        entries.append((link, "link", b"", 0o777, "usr/" + link))
    entries.append(("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", 0o644))
    entries.append(("etc/group", "file", b"root:x:0:\nnogroup:x:65534:\n", 0o644))
    entries.append(("etc/nsswitch.conf", "file", b"passwd: files\ngroup: files\nhosts: files dns\n", 0o644))
    return _layer(entries)


def docker_archive(name: str, layer: bytes, entrypoint: List[str], env: List[str], workdir: str = "/") -> bytes:
    """A one-layer image as a docker-archive tarball (`docker save` layout),
    which `ctr images import` reads; its RepoTags give the image its name."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": entrypoint, "Env": env, "WorkingDir": workdir},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hack/node/nodecfg.py image"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id[len("sha256:"):] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, config_name, "file", config_bytes, 0o644)
        _tar_add(tar, layer_name.split("/")[0], "dir")
        _tar_add(tar, layer_name, "file", layer, 0o644)
        _tar_add(tar, "manifest.json", "file", json.dumps(manifest).encode(), 0o644)
    return buf.getvalue()


def oci_uncompressed(data: bytes) -> bytes:
    """An OCI image archive (oci-layout, index.json, blobs/) with its gzip
    layers stored uncompressed: the same image (a layer's uncompressed digest
    is its diff ID, which the config keeps), whose archive xz then compresses
    far better than gzip's output (what bundle-images carries to the GPU
    machine). Manifests and the index are rewritten with the new digests."""
    import gzip

    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    blobs = {n[len("blobs/"):].replace("/", ":", 1): b for n, b in files.items() if n.startswith("blobs/")}
    index = json.loads(files["index.json"])
    for desc in index["manifests"]:
        manifest = json.loads(blobs.pop(desc["digest"]))
        for layer in manifest["layers"]:
            if layer["mediaType"].endswith("+gzip"):
                raw = gzip.decompress(blobs.pop(layer["digest"]))
                layer["digest"] = "sha256:" + hashlib.sha256(raw).hexdigest()
                layer["size"] = len(raw)
                layer["mediaType"] = layer["mediaType"][: -len("+gzip")]
                blobs[layer["digest"]] = raw
        body = json.dumps(manifest, separators=(",", ":")).encode()
        desc["digest"], desc["size"] = "sha256:" + hashlib.sha256(body).hexdigest(), len(body)
        blobs[desc["digest"]] = body
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        _tar_add(out, "oci-layout", "file", files["oci-layout"], 0o644)
        _tar_add(out, "index.json", "file", json.dumps(index).encode(), 0o644)
        _tar_add(out, "blobs", "dir")
        _tar_add(out, "blobs/sha256", "dir")
        for digest, body in sorted(blobs.items()):
            _tar_add(out, "blobs/" + digest.replace(":", "/"), "file", body, 0o644)
    return buf.getvalue()


# --- the demo jobs ------------------------------------------------------------


def venv_base_prefix(venv: str) -> Optional[str]:
    """Where the environment's base interpreter lives (pyvenv.cfg `home`,
    one level up), when it is outside /usr: that folder must be mounted too."""
    cfg = Path(venv) / "pyvenv.cfg"
    if not cfg.is_file():
        return None
    for line in cfg.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home":
            prefix = str(Path(value.strip()).parent)
            if prefix == "/usr" or prefix.startswith("/usr/") or prefix.startswith(venv.rstrip("/") + "/"):
                return None
            return prefix
    return None


def node_template(
    command: List[str],
    repo: str,
    python_roots: Sequence[str] = ("/opt/torch/.venv",),
    cpu: str = "1",
    memory: str = "8Gi",
    env: Optional[Dict[str, str]] = None,
    allocator_lib: Optional[str] = None,
) -> dict:
    """The pod template of a demo job on this node: the local training image,
    the host's /usr, the Python environment (and its base interpreter's
    prefix when that is outside /usr) and the repository read-only at the same
    paths, host networking, small requests (the kubelet rejects a pod bound by
    nodeName whose requests exceed the node's allocatable: the examples' 8 CPUs
    x three jobs would not fit a 16-core machine).

    `allocator_lib`: the node's libvramfit_alloc.so, mounted read-only at
    ALLOCATOR_MOUNT with VRAMFIT_ALLOCATOR_LIB pointing at it, so the helper's
    configure() makes it PyTorch's allocator with the attempt's
    VRAMFIT_BUDGET_BYTES (the controller sets that and VRAMFIT_STATS_DIR, where
    the library publishes the counters the agent reads)."""
    paths = ["/usr"] + [p for p in python_roots if p != "/usr" and not p.startswith("/usr/")] + [repo]
    volumes, mounts = [], []
    for i, path in enumerate(paths):
        name = f"host-{i}"
        volumes.append({"name": name, "hostPath": {"path": path, "type": "Directory"}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    env = dict(env or {})
    if allocator_lib:
        volumes.append({"name": "vramfit-alloc", "hostPath": {"path": allocator_lib, "type": "File"}})
        mounts.append({"name": "vramfit-alloc", "mountPath": ALLOCATOR_MOUNT, "readOnly": True})
        env["VRAMFIT_ALLOCATOR_LIB"] = ALLOCATOR_MOUNT
    container = {
        "name": "train",
        "image": TRAIN_IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
        "env": [{"name": "PYTHONPATH", "value": repo.rstrip("/") + "/python"}]
        + [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
        "volumeMounts": mounts,
    }
    if os.environ.get("VRAMFIT_NODE_PRIVILEGED") == "1":
        # A fallback for a node where CDI cannot inject device nodes: a
        # privileged container gets every host /dev/nvidia* from the runtime
        # (the demo's CDI check then fails, as it should).
        container["securityContext"] = {"privileged": True}
    return {
        "metadata": {"labels": {"vramfit.dev/demo": "gpunode"}},
        "spec": {
            "hostNetwork": True,
            "dnsPolicy": "Default",
            "containers": [container],
            "volumes": volumes,
        },
    }


#: Where the training image (hack/node/trainimage.py) puts the demo's train.py.
IMAGE_TRAIN_PATH = "/opt/vramfit/train.py"
#: The training image's user (non-root, as Pod Security restricted wants).
IMAGE_UID = 65532


def image_template(command: List[str], image: str, cpu: str = "1", memory: str = "8Gi") -> dict:
    """The pod template of a demo job run from the training image
    (hack/node/trainimage.py): nothing of the node (no hostPath, no volume of
    its own, not on the host network), non-root with no capability and no
    privilege escalation, so that it passes Pod Security restricted; the
    allocator is the wheel's libvramfit_alloc.so inside the image, which the
    helper finds by itself."""
    return {
        "metadata": {"labels": {"vramfit.dev/demo": "gpunode"}},
        "spec": {
            "dnsPolicy": "Default",
            "securityContext": {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "train",
                "image": image,
                "imagePullPolicy": "Never",
                "command": command,
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def _load_yaml_docs(path: Path) -> List[dict]:
    import yaml  # only here: the other commands need nothing beyond the standard library

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


#: The demo's job profiled automatically (model.auto; chart mode with a GPU).
AUTO_JOB = "auto-opt"
#: Its tokens per sample.
AUTO_SEQ_LEN = 512


def demo_jobs(
    repo: str,
    python: str,
    python_roots: Sequence[str],
    steps: int,
    gpu: bool = True,
    allocator_lib: Optional[str] = None,
    image: Optional[str] = None,
    namespaces: Sequence[str] = ("ml",),
) -> List[dict]:
    """The demo's TrainingJobs, built from examples/: their model, batch and
    memory specs as written there, the pod template replaced by this node's.

    `image`: the pods run the training image (`python` is the environment's
    interpreter inside it, train.py at IMAGE_TRAIN_PATH) with nothing of the
    node, the jobs spread over `namespaces` in turn, and with a GPU two jobs
    more: `overbudget-twice`, whose first two attempts allocate past their
    budget outside PyTorch (the watchdog must stop each; the third trains),
    and `auto-opt` (AUTO_JOB), an OPT-125m described only as `model.auto`,
    which the controller profiles on a CPU before it places it.

    With a GPU: GPT-2 small (Hugging Face GPT2LMHeadModel), the LLaMA-style
    1.1B with checkpointing, a torchvision ResNet-50, a GPT-2 whose
    micro-batch 32 does not fit its 24Gi budget (CUDA OOM, exit protocol,
    micro 16), and one that allocates 20 GiB outside PyTorch on its first
    attempt (the agent's watchdog stops it), and the gpt2-oom shape once more
    with the OOMs absorbed in the process. Without (`gpu=False`): two tiny
    GPT-2s on the CPU, to try the node itself.
    """
    examples = Path(repo) / "examples"
    train = [python, IMAGE_TRAIN_PATH if image else str(Path(repo) / "hack/node/train.py")]
    gpt2 = _load_yaml_docs(examples / "gpt2-small-amp.yaml")[0]
    llama = _load_yaml_docs(examples / "llama-1b-hf.yaml")[0]

    made: List[dict] = []

    def job(base: dict, name: str, args: List[str], **spec_changes) -> dict:
        j = json.loads(json.dumps(base))
        ns = namespaces[len(made) % len(namespaces)]
        j["metadata"] = {"name": name, "namespace": ns, "labels": {"vramfit.dev/demo": "gpunode"}}
        j["spec"].update(spec_changes)
        if image:
            # Without a GPU (a small development machine) the two tiny CPU
            # jobs and the chart's pods must fit the CPU left beside CPU 0.
            j["spec"]["template"] = image_template(train + args, image, cpu="1" if gpu else "250m")
        else:
            j["spec"]["template"] = node_template(train + args, repo, python_roots, allocator_lib=allocator_lib)
        made.append(j)
        return j

    if not gpu:
        cpu = ["--device", "cpu", "--tiny", "--seq-len", "64", "--steps", str(steps)]
        return [
            job(gpt2, "cpu-gpt2-a", ["--model", "gpt2"] + cpu, batch={"global": 8, "micro": 4}),
            job(gpt2, "cpu-gpt2-b", ["--model", "gpt2"] + cpu, batch={"global": 8, "micro": 2}),
        ]
    hf_config = json.dumps(llama["spec"]["model"]["huggingFace"]["config"], sort_keys=True)
    llama_steps = max(3, steps // 3)
    resnet = job(
        gpt2,
        "resnet50",
        ["--model", "resnet50", "--steps", str(steps)],
        batch={"global": 256, "micro": 64, "minMicro": 8},
        memory={"request": "14Gi"},
    )
    # The predictor has no convolutional family yet: the CNN states its budget
    # (memory.request), and its model entry only keys its measurements.
    resnet["spec"]["model"] = {"mlp": {"layers": 50, "hidden": 2048}, "precision": "amp-bf16", "optimizer": "sgd-momentum"}
    jobs = [
        job(gpt2, "gpt2-small", ["--model", "gpt2", "--steps", str(steps)]),
        job(llama, "llama-1b", ["--model", "llama", "--seq-len", "2048", "--hf-config", hf_config,
                                "--steps", str(llama_steps)]),
        resnet,
        job(gpt2, "gpt2-oom", ["--model", "gpt2", "--steps", str(steps)],
            batch={"global": 64, "micro": 32, "minMicro": 4}, memory={"request": "24Gi"}, maxOOMRetries=3),
        job(gpt2, "bypass", ["--model", "bypass", "--bypass-bytes", str(20 << 30), "--steps", str(steps)],
            batch={"global": 16, "micro": 8, "minMicro": 2}, memory={"request": "10Gi"}, maxOOMRetries=3),
        # The same shape as gpt2-oom, but the OOMs are absorbed inside the
        # process (vramfit.Step halves the micro-batch and re-runs the step):
        # one attempt, the new shape reaches the GpuNode and the job's status.
        job(gpt2, "gpt2-absorb", ["--model", "gpt2", "--steps", str(steps), "--absorb"],
            batch={"global": 64, "micro": 32, "minMicro": 4}, memory={"request": "24Gi"}, maxOOMRetries=3),
    ]
    if image:
        # A tenant's attack: after the watchdog's first stop, the next attempt
        # goes over its budget again (the watchdog must stop every episode).
        jobs.append(job(gpt2, "overbudget-twice", ["--model", "bypass", "--bypass-bytes", str(20 << 30),
                                                   "--bypass-attempts", "2", "--steps", str(steps)],
                        batch={"global": 16, "micro": 8, "minMicro": 2}, memory={"request": "10Gi"}, maxOOMRetries=3))
        # Automatic profiling: OPT-125m's shape, a family the analytic
        # predictor does not know, described only as model.auto. The
        # controller first runs the pod without a GPU (phase Profiling,
        # VRAMFIT_PHASE=profile: train.py's vramfit.Step captures the step on
        # the CPU and prints the profile), stores the profile in a ConfigMap
        # owned by the job and predicts from it (predictionSource profile);
        # then it trains on the GPU within that budget.
        auto = job(gpt2, AUTO_JOB, ["--model", "opt", "--seq-len", str(AUTO_SEQ_LEN), "--steps", str(steps)],
                   batch={"global": 64, "micro": 4, "minMicro": 1})
        auto["spec"]["model"] = {"auto": {}, "precision": "amp-bf16", "optimizer": "adamw"}
        jobs.append(auto)
    return jobs


#: The elastic pair's names (hack/node/chartdemo.sh runs them once the demo's jobs are done).
ELASTIC_JOBS = ("elastic-a", "elastic-b")


def elastic_jobs(repo: str, python: str, image: str, namespace: str = "team-a", steps: int = 5) -> List[dict]:
    """Two identical memory-elastic GPT-2 jobs (`batch.elastic`) in fp32
    whose preferred shape (micro 32 x 2, predicted about 72 GB on an H200)
    does not fit twice on one GPU: on an empty H200 one takes it and the
    other starts at once with a smaller micro-batch and more accumulation,
    the same global batch. train.py --exact makes the maths independent of
    the shape, so their held-out losses must agree within 1e-3."""
    gpt2 = _load_yaml_docs(Path(repo) / "examples" / "gpt2-small-amp.yaml")[0]
    train = [python, IMAGE_TRAIN_PATH, "--model", "gpt2", "--exact", "--steps", str(steps)]
    jobs = []
    for name in ELASTIC_JOBS:
        j = json.loads(json.dumps(gpt2))
        j["metadata"] = {"name": name, "namespace": namespace, "labels": {"vramfit.dev/demo": "gpunode-elastic"}}
        j["spec"]["batch"] = {"global": 64, "micro": 32, "minMicro": 1, "elastic": True}
        j["spec"]["model"]["precision"] = "fp32"
        j["spec"]["model"]["huggingFace"]["config"].update({"resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0})
        j["spec"]["template"] = image_template(train, image)
        jobs.append(j)
    return jobs


def oci_devices(text: str, container: str = "train") -> List[str]:
    """One line per container named `container` in a stream of `ctr
    containers info` JSON documents: the pod, the device nodes of its OCI
    spec, the device-cgroup rules that allow something, and whether it has
    CAP_SYS_ADMIN (what CDI and the runtime actually gave it)."""
    lines = []
    for d in _json_docs(text):
        labels = d.get("Labels") or {}
        if labels.get("io.kubernetes.container.name") != container:
            continue
        spec = d.get("Spec") or {}
        linux = spec.get("linux") or {}
        nodes = [f"{n.get('path')} {n.get('type')} {n.get('major')}:{n.get('minor')}" for n in linux.get("devices") or []]
        rules = [
            f"{r.get('type', 'a')} {r.get('major', '*')}:{r.get('minor', '*')} {r.get('access')}"
            for r in (linux.get("resources") or {}).get("devices") or []
            if r.get("allow")
        ]
        caps = ((spec.get("process") or {}).get("capabilities") or {}).get("effective") or []
        lines.append(f"{labels.get('io.kubernetes.pod.name')}: devices {nodes}; allowed {rules}; "
                     f"CAP_SYS_ADMIN {'CAP_SYS_ADMIN' in caps}")
    return sorted(lines)


def _json_docs(text: str) -> List[dict]:
    dec = json.JSONDecoder()
    docs, i = [], 0
    while i < len(text):
        if text[i] == "{":
            doc, i = dec.raw_decode(text, i)
            docs.append(doc)
        else:
            i += 1
    return docs


#: Where containerd's CRI keeps the pods' network namespaces (bind mounts).
NETNS_DIRS = ("/var/run/netns/", "/run/netns/")


def oci_netns(text: str) -> List[str]:
    """The network namespaces the containers of a stream of `ctr containers
    info` JSON documents join, those containerd made for pods (bind-mounted
    under /run/netns): what `gpunode.sh down` unmounts after containerd is
    stopped, so that no namespace, nor the veth of its pod network, outlives
    the node."""
    paths = set()
    for d in _json_docs(text):
        for n in (((d.get("Spec") or {}).get("linux") or {}).get("namespaces")) or []:
            path = n.get("path") or ""
            if n.get("type") == "network" and path.startswith(NETNS_DIRS) and "/" not in path.split("netns/", 1)[1]:
                paths.add(path)
    return sorted(paths)


# --- command line ---------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="nodecfg.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("containerd")
    c.add_argument("--dir", required=True)
    c.add_argument("--runc", required=True)
    c.add_argument("--sandbox-image", default=PAUSE_IMAGE)
    k = sub.add_parser("kubelet")
    k.add_argument("--dir", required=True)
    k.add_argument("--endpoint", required=True)
    k.add_argument("--healthz-port", type=int, required=True)
    k.add_argument("--port", type=int, required=True)
    k.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    k.add_argument("--cpu-manager", default="static")
    k.add_argument("--reserved-cpus", default="0")
    k.add_argument("--client-ca", help="the CA of the clients the kubelet's API accepts")
    kk = sub.add_parser("kubeconfig", help="the kubelet's kubeconfig with the node's certificate")
    kk.add_argument("--server", required=True)
    kk.add_argument("--pki", required=True, help="a folder with ca.crt, node.crt, node.key and node-name")
    cn = sub.add_parser("cni", help="the CNI network: loopback only, a bridge (--bridge) or isolated (--isolated)")
    cn.add_argument("--bridge", help="the pod network's bridge")
    cn.add_argument("--isolated", action="store_true", help="lo alone and an address no interface carries")
    cn.add_argument("--subnet", default="10.89.0.0/24")
    cn.add_argument("--data-dir", help="where the addresses handed out are kept")
    d = sub.add_parser("cdi")
    d.add_argument("--driver-root", default="/usr/local/nvidia")
    d.add_argument("--dev", default="/dev")
    d.add_argument("--proc", default="/proc/driver/nvidia")
    ds = sub.add_parser("cdi-simulated", help="a CDI spec for the simulated GPUs of a GpuNode (JSON on stdin)")
    ds.add_argument("--dev", required=True, help="where the stand-in device nodes are made")
    n = sub.add_parser("nri-config")
    n.add_argument("--log", required=True)
    n.add_argument("--agent-namespace", action="append", default=[],
                   help="a namespace whose pods may ask for GPUs with cdi.k8s.io annotations (repeatable)")
    i = sub.add_parser("image")
    i.add_argument("which", choices=["pause", "train"])
    i.add_argument("--out", required=True)
    i.add_argument("--pause", help="the pause binary (for the pause image)")
    sub.add_parser("oci-devices", help="the device nodes of training containers (ctr containers info on stdin)")
    sub.add_parser("oci-netns", help="the pods' network namespaces under /run/netns (ctr containers info on stdin)")
    ou = sub.add_parser("oci-uncompress", help="an OCI image archive with its gzip layers stored uncompressed")
    ou.add_argument("src")
    ou.add_argument("dst")
    v = sub.add_parser("venv-base")
    v.add_argument("venv")
    j = sub.add_parser("jobs")
    j.add_argument("--repo", required=True)
    j.add_argument("--python", required=True, help="the interpreter the pods run (a host path)")
    j.add_argument("--root", action="append", default=[], help="a host folder the interpreter needs (repeatable)")
    j.add_argument("--steps", type=int, default=20)
    j.add_argument("--cpu", action="store_true", help="the CPU jobs (no GPU on this machine)")
    j.add_argument("--allocator-lib", help="the node's libvramfit_alloc.so, mounted into the pods")
    j.add_argument("--image", help="run the training image (hack/node/trainimage.py) instead of mounting the node's "
                                   "folders; --python is then the interpreter inside it")
    j.add_argument("--namespaces", default="ml", help="comma-separated namespaces the jobs go to in turn")
    e = sub.add_parser("elastic-jobs", help="the two memory-elastic GPT-2 jobs of the chart run")
    e.add_argument("--repo", required=True)
    e.add_argument("--python", required=True, help="the interpreter inside the training image")
    e.add_argument("--image", required=True)
    e.add_argument("--namespace", default="team-a")
    e.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    try:
        if args.cmd == "containerd":
            sys.stdout.write(containerd_config(args.dir, args.runc, args.sandbox_image))
        elif args.cmd == "kubelet":
            sys.stdout.write(
                kubelet_config(args.dir, args.endpoint, args.healthz_port, args.port, args.cpus,
                               args.reserved_cpus, args.cpu_manager, args.client_ca)
            )
        elif args.cmd == "kubeconfig":
            pki = Path(args.pki)
            for f in ("ca.crt", "node.crt", "node.key", "node-name"):
                if not (pki / f).is_file():
                    raise ValueError(f"{pki / f} is missing (hack/controlplane.sh node-cert NAME makes it)")
            sys.stdout.write(node_kubeconfig(args.server, str(pki / "ca.crt"), str(pki / "node.crt"),
                                             str(pki / "node.key"), (pki / "node-name").read_text().strip()))
        elif args.cmd == "cni":
            if (args.bridge or args.isolated) and not args.data_dir:
                raise ValueError("--bridge and --isolated need --data-dir")
            if args.bridge and args.isolated:
                raise ValueError("--bridge or --isolated, not both")
            if args.bridge:
                sys.stdout.write(cni_bridge_config(args.bridge, args.subnet, args.data_dir))
            elif args.isolated:
                sys.stdout.write(cni_isolated_config(args.subnet, args.data_dir))
            else:
                sys.stdout.write(cni_config())
        elif args.cmd == "cdi":
            json.dump(cdi_spec(args.driver_root, args.dev, args.proc), sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif args.cmd == "cdi-simulated":
            json.dump(cdi_spec_simulated(json.load(sys.stdin), args.dev), sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif args.cmd == "nri-config":
            sys.stdout.write(nri_plugin_config(args.log, args.agent_namespace))
        elif args.cmd == "image":
            if args.which == "pause":
                if not args.pause:
                    raise ValueError("image pause needs --pause BINARY")
                data = docker_archive(PAUSE_IMAGE, pause_layer(Path(args.pause).read_bytes()), ["/pause"], [])
            else:
                data = docker_archive(TRAIN_IMAGE, train_layer(), [], TRAIN_ENV, "/workspace")
            Path(args.out).write_bytes(data)
        elif args.cmd == "jobs":
            if args.allocator_lib and not Path(args.allocator_lib).is_file():
                raise ValueError(f"--allocator-lib {args.allocator_lib}: no such file")
            jobs = demo_jobs(args.repo, args.python, args.root, args.steps, gpu=not args.cpu,
                             allocator_lib=args.allocator_lib, image=args.image,
                             namespaces=[n for n in args.namespaces.split(",") if n])
            json.dump({"apiVersion": "v1", "kind": "List", "items": jobs}, sys.stdout, indent=1)
            sys.stdout.write("\n")
        elif args.cmd == "elastic-jobs":
            jobs = elastic_jobs(args.repo, args.python, args.image, args.namespace, args.steps)
            json.dump({"apiVersion": "v1", "kind": "List", "items": jobs}, sys.stdout, indent=1)
            sys.stdout.write("\n")
        elif args.cmd == "oci-uncompress":
            Path(args.dst).write_bytes(oci_uncompressed(Path(args.src).read_bytes()))
        elif args.cmd == "oci-devices":
            for line in oci_devices(sys.stdin.read()):
                print(line)
        elif args.cmd == "oci-netns":
            for path in oci_netns(sys.stdin.read()):
                print(path)
        elif args.cmd == "venv-base":
            base = venv_base_prefix(args.venv)
            if base:
                print(base)
    except (ValueError, OSError) as exc:
        print(f"nodecfg.py {args.cmd}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
