#!/usr/bin/env python3
"""A CNI plugin for the one-node cluster of hack/gpunode.sh (`up --pod-network`):
each pod gets a veth pair, its end named eth0 with an address of one /24, the
other end on a Linux bridge whose address is the pods' gateway. No NAT, no
forwarding: the pods reach this host (the gateway address) and each other,
nothing else, and the host (the kubelet's probes) reaches them.

Network configuration (the conflist gpunode.sh writes):
  {"type": "vramfit-bridge", "bridge": "vramfit0", "subnet": "10.89.0.0/24",
   "dataDir": "/var/lib/vramfit-node/cni/ipam"}
The gateway is the subnet's first address; pods get the others, one file per
address in dataDir holding the container's id.

With "isolated": true (a machine without `ip`, the GPU node with the chart)
nothing is configured: the pod keeps its own network namespace with `lo`
alone (the loopback plugin before this one), and the result names an
address of the subnet for its eth0 that no interface carries. containerd
refuses a sandbox whose CNI result has no address ("failed to find network
info for sandbox"); pods that need no network (training pods, which Pod
Security baseline keeps off the host network) then start, and the address in
their status leads nowhere.
"""

import fcntl
import hashlib
import ipaddress
import json
import os
import subprocess
import sys

VERSIONS = ["0.4.0", "1.0.0"]


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *args]
    if netns:
        cmd = ["nsenter", f"--net={netns}", *cmd]
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def fail(code: int, msg: str, details: str = "") -> None:
    json.dump({"cniVersion": "1.0.0", "code": code, "msg": msg, "details": details}, sys.stdout)
    sys.exit(1)


def host_ifname(container_id: str, ifname: str) -> str:
    return "vf" + hashlib.sha256(f"{container_id}/{ifname}".encode()).hexdigest()[:11]


def ensure_bridge(bridge: str, gateway: str, prefix: int) -> None:
    if ip("link", "show", bridge, check=False).returncode != 0:
        ip("link", "add", bridge, "type", "bridge", check=False)
    if gateway not in ip("-o", "addr", "show", "dev", bridge).stdout:
        ip("addr", "add", f"{gateway}/{prefix}", "dev", bridge, check=False)
    ip("link", "set", bridge, "up")


def move_into(link: str, netns: str, tag: str) -> None:
    """`ip link set LINK netns NAME` takes a name under /run/netns: the pod's
    namespace as it is named there, else bound there for the move."""
    real = os.path.realpath(netns)
    for d in ("/run/netns", "/var/run/netns"):
        if os.path.dirname(real) == os.path.realpath(d):
            ip("link", "set", link, "netns", os.path.basename(real))
            return
    os.makedirs("/run/netns", exist_ok=True)
    name = f"vramfit-{tag}"
    target = f"/run/netns/{name}"
    open(target, "a").close()
    subprocess.run(["mount", "--bind", netns, target], check=True)
    try:
        ip("link", "set", link, "netns", name)
    finally:
        subprocess.run(["umount", target], check=False)
        os.unlink(target)


def allocate(data_dir: str, net: ipaddress.IPv4Network, key: str) -> ipaddress.IPv4Address:
    hosts = list(net.hosts())[1:]
    for addr in hosts:
        path = os.path.join(data_dir, str(addr))
        if os.path.exists(path) and open(path).read().strip() == key:
            return addr
    for addr in hosts:
        path = os.path.join(data_dir, str(addr))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        os.write(fd, key.encode())
        os.close(fd)
        return addr
    fail(11, f"no free address in {net}")
    raise AssertionError


def release(data_dir: str, key: str) -> None:
    for name in os.listdir(data_dir):
        path = os.path.join(data_dir, name)
        try:
            if name != "lock" and open(path).read().strip() == key:
                os.unlink(path)
        except OSError:
            pass


def main() -> None:
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        json.dump({"cniVersion": "1.0.0", "supportedVersions": VERSIONS}, sys.stdout)
        return
    conf = json.load(sys.stdin)
    version = conf.get("cniVersion", "1.0.0")
    bridge = conf.get("bridge", "vramfit0")
    net = ipaddress.ip_network(conf.get("subnet", "10.89.0.0/24"))
    gateway = next(net.hosts())
    data_dir = conf.get("dataDir", "/var/lib/cni/vramfit-bridge")
    os.makedirs(data_dir, exist_ok=True)
    container = os.environ.get("CNI_CONTAINERID", "")
    ifname = os.environ.get("CNI_IFNAME", "eth0")
    netns = os.environ.get("CNI_NETNS", "")
    key = f"{container}/{ifname}"
    veth = host_ifname(container, ifname)
    with open(os.path.join(data_dir, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if conf.get("isolated"):
            if command == "ADD":
                addr = allocate(data_dir, net, key)
                result = {
                    "cniVersion": version,
                    "interfaces": [{"name": ifname, "sandbox": netns}],
                    "ips": [{"address": f"{addr}/{net.prefixlen}", "interface": 0}],
                    "dns": {},
                }
                if version == "0.4.0":
                    result["ips"][0]["version"] = "4"
                json.dump(result, sys.stdout)
            elif command == "DEL":
                release(data_dir, key)
            elif command not in ("CHECK", "STATUS", "GC"):
                fail(4, f"unknown CNI_COMMAND {command!r}")
            return
        if command == "ADD":
            ensure_bridge(bridge, str(gateway), net.prefixlen)
            addr = allocate(data_dir, net, key)
            tmp = veth + "p"
            ip("link", "del", veth, check=False)
            try:
                ip("link", "add", veth, "type", "veth", "peer", "name", tmp)
                ip("link", "set", veth, "master", bridge)
                ip("link", "set", veth, "up")
                move_into(tmp, netns, veth)
                ip("link", "set", tmp, "name", ifname, netns=netns)
                ip("addr", "add", f"{addr}/{net.prefixlen}", "dev", ifname, netns=netns)
                ip("link", "set", ifname, "up", netns=netns)
                ip("route", "add", "default", "via", str(gateway), netns=netns)
                mac = ip("-o", "link", "show", ifname, netns=netns).stdout.split("link/ether ")[1].split()[0]
            except subprocess.CalledProcessError as e:
                ip("link", "del", veth, check=False)
                release(data_dir, key)
                fail(100, f"{' '.join(e.cmd)}: {e.stderr.strip()}")
            result = {
                "cniVersion": version,
                "interfaces": [{"name": veth}, {"name": ifname, "mac": mac, "sandbox": netns}],
                "ips": [{"address": f"{addr}/{net.prefixlen}", "gateway": str(gateway), "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": str(gateway)}],
                "dns": {},
            }
            if version == "0.4.0":
                result["ips"][0]["version"] = "4"
            json.dump(result, sys.stdout)
        elif command == "DEL":
            ip("link", "del", veth, check=False)
            release(data_dir, key)
        elif command in ("CHECK", "STATUS", "GC"):
            pass
        else:
            fail(4, f"unknown CNI_COMMAND {command!r}")


if __name__ == "__main__":
    main()
