#!/usr/bin/env python3
"""A CNI plugin for the one-node cluster of hack/gpunode.sh where no bridge
can be made (`up --cluster-only` when vramfit-podnet's trial of the bridge
network fails, or `all --chart --host-network`): nothing is configured, the
pod keeps its own network namespace with `lo` alone (the loopback plugin
before this one), and the result names an address of the subnet for its
eth0 that no interface carries. containerd refuses a sandbox whose CNI
result has no address ("failed to find network info for sandbox"); pods that
need no network (training pods, which Pod Security keeps off the host
network) then start, and the address in their status leads nowhere.

Network configuration (nodecfg.py cni --isolated):
  {"type": "vramfit-isolated", "subnet": "10.89.1.0/24",
   "dataDir": "/var/lib/vramfit-node/cni/ipam"}
Pods get the subnet's addresses but its first, one file per address in
dataDir holding the container's id and interface. Only the standard library.
"""

import fcntl
import ipaddress
import json
import os
import sys

VERSIONS = ["0.4.0", "1.0.0"]


def fail(code: int, msg: str, details: str = "") -> None:
    json.dump({"cniVersion": "1.0.0", "code": code, "msg": msg, "details": details}, sys.stdout)
    sys.exit(1)


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
    net = ipaddress.ip_network(conf.get("subnet", "10.89.1.0/24"))
    data_dir = conf.get("dataDir", "/var/lib/cni/vramfit-isolated")
    os.makedirs(data_dir, exist_ok=True)
    ifname = os.environ.get("CNI_IFNAME", "eth0")
    netns = os.environ.get("CNI_NETNS", "")
    key = f"{os.environ.get('CNI_CONTAINERID', '')}/{ifname}"
    with open(os.path.join(data_dir, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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


if __name__ == "__main__":
    main()
