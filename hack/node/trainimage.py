#!/usr/bin/env python3
"""The training image, built on the node from the node's own Python
environment and vramfit's wheel, streamed as a docker-archive tarball that
`ctr -n k8s.io images import` reads (from a file, or from a pipe: `--out -`).

    trainimage.py --venv /opt/torch/.venv --wheel vramfit-*.whl --out - | ctr ... images import -

One layer holds:

- the virtual environment at its own path, with vramfit's package unpacked
  from the wheel into its site-packages (libvramfit_alloc.so inside it);
- the base interpreter's prefix (pyvenv.cfg `home`, one level up) at its own
  path, without its own site-packages when the environment does not use them
  and without the standard library's tests;
- the shared libraries the ELF files of both need from the system (DT_NEEDED,
  resolved as the loader would: RPATH/RUNPATH with $ORIGIN, the files of the
  image, then the system's library folders), with the loader, each path's
  symbolic links reproduced as on the host; the NVIDIA driver's libraries are
  left out (CDI mounts the driver tree into GPU containers);
- /bin/sh, a minimal /etc (root and the user `trainer`, --uid), /tmp, and the
  demo's train.py at /opt/vramfit/train.py.

Nothing is held in memory: a first pass lists the files and sizes (the
layer's size is known before a byte is written, as the outer tarball's
header needs), a second streams them, hashing the layer for its diff ID; the
config and manifest follow the layer. Only the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import stat
import struct
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

IMAGE = "localhost/vramfit/train-venv:dev"
TRAIN_PATH = "/opt/vramfit/train.py"
#: Libraries the NVIDIA driver provides (CDI mounts the driver tree): never copied.
DRIVER_PREFIXES = ("libcuda.so", "libnvidia-", "libcudadebugger.so", "libnvcuvid.so", "libnvoptix.so")
#: What the driver's libraries (libcuda, libnvidia-ml), which CDI mounts,
#: link from the system: added whether or not anything in the image needs them.
DRIVER_NEEDS = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
#: Prefixes a base interpreter shares with other software: only its own parts are copied.
SHARED_PREFIXES = ("/", "/usr", "/usr/local", "/opt")
#: Where a dynamic loader looks when nothing else says (Debian multiarch first).
SYSTEM_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
BLOCK = 512


# --- ELF --------------------------------------------------------------------------


def elf_deps(source) -> Optional[Tuple[List[str], List[str], Optional[str]]]:
    """(DT_NEEDED names, RUNPATH or else RPATH folders, PT_INTERP) of a 64-bit
    little-endian ELF file (a path, or its bytes); None when it is not one."""
    try:
        with (io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")) as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            phdrs = f.read(phentsize * phnum)
            loads, dynamic, interp = [], None, None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", phdrs, i * phentsize)
                if p_type == 1:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == 2:
                    dynamic = (p_offset, p_filesz)
                elif p_type == 3:
                    f.seek(p_offset)
                    interp = f.read(p_filesz).rstrip(b"\0").decode()
            if dynamic is None:
                return [], [], interp
            f.seek(dynamic[0])
            dyn = f.read(dynamic[1])
            needed, rpath, runpath, strtab = [], None, None, None
            for i in range(0, len(dyn) - 15, 16):
                tag, val = struct.unpack_from("<qQ", dyn, i)
                if tag == 0:
                    break
                if tag == 1:
                    needed.append(val)
                elif tag == 5:
                    strtab = val
                elif tag == 15:
                    rpath = val
                elif tag == 29:
                    runpath = val
            if strtab is None:
                return [], [], interp
            # The string table's file offset, from the segment that maps it.
            base = next((off + strtab - va for va, off, sz in loads if va <= strtab < va + sz), None)
            if base is None:
                return [], [], interp

            def string(offset: int) -> str:
                f.seek(base + offset)
                out = b""
                while True:
                    chunk = f.read(256)
                    if not chunk:
                        break
                    end = chunk.find(b"\0")
                    if end >= 0:
                        out += chunk[:end]
                        break
                    out += chunk
                return out.decode(errors="replace")

            search = runpath if runpath is not None else rpath
            folders = [d for d in string(search).split(":") if d] if search is not None else []
            return [string(n) for n in needed], folders, interp
    except (OSError, struct.error):
        return None


# --- what goes in -------------------------------------------------------------------


class Layer:
    """The layer's entries, in order, each path once: (path in the image,
    host path or None, kind, mode, size, link target, mtime)."""

    def __init__(self) -> None:
        self.entries: Dict[str, tuple] = {}
        self.elves: List[str] = []  # host paths of ELF files to resolve
        self.inline_elves: Dict[str, bytes] = {}  # ELF files from the wheel: path in the image -> contents

    def add_dir(self, path: str, mode: int = 0o755, mtime: int = 0) -> None:
        path = path.strip("/")
        if not path or path in self.entries:
            return
        parent = os.path.dirname(path)
        if parent:
            self.add_host_path("/" + parent, as_dir=True)
        self.entries[path] = (None, "dir", mode, 0, "", mtime)

    def add_file(self, path: str, data_from: Optional[str], mode: int, size: int, mtime: int = 0) -> None:
        path = path.strip("/")
        parent = os.path.dirname(path)
        if parent:
            self.add_host_path("/" + parent, as_dir=True)
        self.entries[path] = (data_from, "file", mode, size, "", mtime)

    def add_host_path(self, host: str, as_dir: bool = False) -> None:
        """A host path as it is, with every symbolic link on the way to it
        reproduced (so /lib64/ld-linux-x86-64.so.2 becomes the link
        lib64 -> usr/lib64, the link in usr/lib64 and the file it names)."""
        host = os.path.normpath(host)
        if host == "/" or host.strip("/") in self.entries:
            return
        parent = os.path.dirname(host)
        if parent != "/":
            self.add_host_path(parent, as_dir=True)
            real_parent = os.path.realpath(parent)
            if real_parent != parent:
                # A link on the way (added above): what it names is reached through its target.
                self.add_host_path(os.path.join(real_parent, os.path.basename(host)), as_dir=as_dir)
                return
        try:
            st = os.lstat(host)
        except OSError:
            if as_dir:
                self.entries[host.strip("/")] = (None, "dir", 0o755, 0, "", 0)
            return
        key = host.strip("/")
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(host)
            self.entries[key] = (None, "link", 0o777, 0, target, int(st.st_mtime))
            self.add_host_path(os.path.join(os.path.dirname(host), target), as_dir=as_dir)
        elif stat.S_ISDIR(st.st_mode):
            self.entries[key] = (None, "dir", (st.st_mode & 0o7777) | 0o555, 0, "", int(st.st_mtime))
        elif stat.S_ISREG(st.st_mode):
            self.entries[key] = (host, "file", (st.st_mode & 0o7777) | 0o444, st.st_size, "", int(st.st_mtime))
            self.elves.append(host)

    def add_tree(self, root: str, skip: Iterable[str] = ()) -> int:
        """Every directory, regular file and link under root (links kept as
        links), less the folders in skip; returns the bytes added."""
        skip = {os.path.normpath(s) for s in skip}
        self.add_host_path(root, as_dir=True)
        total = 0
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if os.path.join(folder, d) not in skip)
            for name in sorted(dirs) + sorted(files):
                host = os.path.join(folder, name)
                try:
                    st = os.lstat(host)
                except OSError:
                    continue
                key = host.strip("/")
                if stat.S_ISLNK(st.st_mode):
                    self.entries[key] = (None, "link", 0o777, 0, os.readlink(host), int(st.st_mtime))
                elif stat.S_ISDIR(st.st_mode):
                    self.entries[key] = (None, "dir", (st.st_mode & 0o7777) | 0o555, 0, "", int(st.st_mtime))
                elif stat.S_ISREG(st.st_mode):
                    self.entries[key] = (host, "file", (st.st_mode & 0o7777) | 0o444, st.st_size, "", int(st.st_mtime))
                    total += st.st_size
                    if name.endswith(".so") or ".so." in name or os.access(host, os.X_OK):
                        self.elves.append(host)
        return total

    def resolve_libraries(self, log) -> Tuple[List[str], List[str]]:
        """Adds the system libraries the ELF files need, transitively.
        Returns (libraries added, names left unresolved)."""
        names_here: Set[str] = {os.path.basename(k) for k, e in self.entries.items() if e[1] in ("file", "link")}
        added: List[str] = []
        missing: Set[str] = set()
        seen: Set[str] = set()
        todo: List = list(self.elves) + [("/" + k, v) for k, v in self.inline_elves.items()]
        for name in DRIVER_NEEDS:
            found = next((os.path.join(d, name) for d in SYSTEM_LIB_DIRS if os.path.exists(os.path.join(d, name))), None)
            if found and name not in names_here:
                names_here.add(name)
                self.add_host_path(found)
                added.append(found)
                todo.append(os.path.realpath(found))
        while todo:
            item = todo.pop()
            path, source = item if isinstance(item, tuple) else (item, item)
            if path in seen:
                continue
            seen.add(path)
            deps = elf_deps(source)
            if deps is None:
                continue
            needed, folders, interp = deps
            if interp and interp.strip("/") not in self.entries:
                self.add_host_path(interp)
                added.append(interp)
                todo.append(os.path.realpath(interp))
            origin = os.path.dirname(path)
            for name in needed:
                if name.startswith(DRIVER_PREFIXES):
                    continue
                if "/" in name:
                    candidates = [name]
                else:
                    candidates = [os.path.join(d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin), name) for d in folders]
                found = next((c for c in candidates if os.path.exists(c)), None)
                if found:
                    if os.path.normpath(found).strip("/") not in self.entries:
                        self.add_host_path(found)
                        added.append(found)
                    todo.append(os.path.realpath(found))
                    continue
                if name in names_here:
                    continue  # a file of the image (found through the loader's list of loaded objects)
                found = next((os.path.join(d, name) for d in SYSTEM_LIB_DIRS if os.path.exists(os.path.join(d, name))), None)
                if found is None:
                    missing.add(name)
                    continue
                names_here.add(name)
                self.add_host_path(found)
                added.append(found)
                todo.append(os.path.realpath(found))
        return added, sorted(missing)


def site_packages(venv: str) -> str:
    found = sorted(Path(venv).glob("lib/python3*/site-packages"))
    if not found:
        raise ValueError(f"{venv}: no lib/python3*/site-packages (not a virtual environment?)")
    return str(found[0])


def venv_home(venv: str) -> Tuple[Optional[str], bool]:
    """(the base interpreter's prefix, whether the environment uses its site-packages)."""
    cfg = Path(venv) / "pyvenv.cfg"
    if not cfg.is_file():
        return None, True
    home, system = None, False
    for line in cfg.read_text().splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key.strip() == "home":
            home = str(Path(value.strip()).parent)
        elif key.strip() == "include-system-site-packages":
            system = value.strip().lower() == "true"
    return home, system


def etc_files(uid: int) -> List[Tuple[str, bytes]]:
    return [
        ("etc/passwd", f"root:x:0:0:root:/root:/bin/sh\ntrainer:x:{uid}:{uid}:trainer:/tmp:/bin/sh\n"
                       "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n".encode()),
        ("etc/group", f"root:x:0:\ntrainer:x:{uid}:\nnogroup:x:65534:\n".encode()),
        ("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n"),
        ("etc/hosts", b"127.0.0.1 localhost\n::1 localhost\n"),
    ]


def plan(venv: str, wheel: str, train: str, uid: int, log) -> Tuple[Layer, Dict[str, bytes], dict]:
    """Everything the layer holds; inline contents (the wheel's files, /etc)
    by path; and figures for the log."""
    venv = os.path.normpath(os.path.abspath(venv))
    layer = Layer()
    inline: Dict[str, bytes] = {}
    figures: dict = {}
    sp = site_packages(venv)
    # The environment, without any vramfit already in it (the wheel's goes in).
    old = [os.path.join(sp, n) for n in os.listdir(sp) if n == "vramfit" or (n.startswith("vramfit-") and n.endswith(".dist-info"))]
    figures["venvBytes"] = layer.add_tree(venv, skip=old)
    home, system = venv_home(venv)
    if home and home not in SHARED_PREFIXES and not home.startswith(venv + "/"):
        skip = [str(p) for p in Path(home).glob("lib/python3*/test")]
        if not system:
            skip += [str(p) for p in Path(home).glob("lib/python3*/site-packages")]
        figures["baseBytes"] = layer.add_tree(home, skip=skip)
        figures["base"] = home
    elif home:
        # A base interpreter in a prefix it shares with other software (/usr,
        # /usr/local: the driver tree and CUDA may live there too): only its
        # binaries (the venv links to them), libpython and standard library.
        for p in sorted(Path(home).glob("bin/python3*")) + sorted(Path(home).glob("lib/libpython3*")):
            layer.add_host_path(str(p))
        figures["baseBytes"] = 0
        for p in sorted(Path(home).glob("lib/python3*")):
            if p.is_dir() and p.name.count(".") == 1:
                skip = [str(p / "test")] + ([] if system else [str(p / "site-packages"), str(p / "dist-packages")])
                figures["baseBytes"] += layer.add_tree(str(p), skip=skip)
        figures["base"] = home
    # vramfit from the wheel, into the environment's site-packages.
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            top = info.filename.split("/", 1)[0]
            if top != "vramfit" and not (top.startswith("vramfit-") and top.endswith(".dist-info")):
                continue
            path = os.path.join(sp, info.filename).strip("/")
            data = z.read(info)
            mode = 0o755 if info.filename.endswith(".so") else 0o644
            layer.add_file(path, None, mode, len(data), int(time.mktime(info.date_time + (0, 0, -1))))
            inline[path] = data
            if data[:4] == b"\x7fELF":
                layer.inline_elves[path] = data
            n += 1
    if not any(p.endswith("/vramfit/libvramfit_alloc.so") for p in inline):
        raise ValueError(f"{wheel}: no vramfit/libvramfit_alloc.so in the wheel (hack/wheel.sh builds it in)")
    figures["wheelFiles"] = n
    # A shell (handy for kubectl exec; the pods run python directly).
    for sh in ("/bin/sh", "/usr/bin/env"):
        if os.path.exists(sh):
            layer.add_host_path(sh)
    added, missing = layer.resolve_libraries(log)
    figures["systemLibraries"] = len(added)
    figures["unresolved"] = missing
    outside = sorted({os.path.dirname(os.path.realpath(a)) for a in added} - {os.path.realpath(d) for d in SYSTEM_LIB_DIRS}
                     - {os.path.dirname(os.path.realpath(p)) for p in layer.elves})
    figures["libraryFoldersOutsideTheDefaults"] = outside
    for d in ("tmp", "var/tmp"):
        layer.entries[d] = (None, "dir", 0o1777, 0, "", 0)
    for d in ("root", "proc", "sys", "dev", "run", "workspace", "etc"):
        layer.add_dir(d)
    for path, data in etc_files(uid):
        layer.add_file(path, None, 0o644, len(data))
        inline[path] = data
    data = Path(train).read_bytes()
    layer.add_file(TRAIN_PATH, None, 0o644, len(data))
    inline[TRAIN_PATH.strip("/")] = data
    return layer, inline, figures


# --- the tarballs -------------------------------------------------------------------


def header(path: str, kind: str, mode: int, size: int, target: str, mtime: int) -> bytes:
    info = tarfile.TarInfo(path + ("/" if kind == "dir" else ""))
    info.mode, info.mtime = mode, max(mtime, 0)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if kind == "dir":
        info.type = tarfile.DIRTYPE
    elif kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, target
    else:
        info.size = size
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def padded(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def ordered(layer: Layer) -> List[Tuple[str, tuple]]:
    # Parents before children: sorted by path components.
    return sorted(layer.entries.items(), key=lambda kv: kv[0].split("/"))


def layer_size(layer: Layer) -> int:
    total = 0
    for path, (_, kind, mode, size, target, mtime) in ordered(layer):
        total += len(header(path, kind, mode, size, target, mtime)) + (padded(size) if kind == "file" else 0)
    return total + 2 * BLOCK


def stream_layer(layer: Layer, inline: Dict[str, bytes], out, digest) -> int:
    written = 0

    def put(b: bytes) -> None:
        nonlocal written
        out.write(b)
        digest.update(b)
        written += len(b)

    for path, (src, kind, mode, size, target, mtime) in ordered(layer):
        put(header(path, kind, mode, size, target, mtime))
        if kind != "file":
            continue
        if src is None:
            data = inline[path]
            put(data)
            left = size - len(data)
        else:
            left = size
            with open(src, "rb") as f:
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        raise ValueError(f"{src} shrank while the image was written")
                    put(chunk)
                    left -= len(chunk)
        put(b"\0" * (padded(size) - size))
    put(b"\0" * (2 * BLOCK))
    return written


def outer_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def write_image(layer: Layer, inline: Dict[str, bytes], out, name: str, uid: int, venv: str) -> Tuple[int, str]:
    """The docker-archive: layer.tar (streamed), then config.json and
    manifest.json. Returns (bytes written, the layer's diff ID)."""
    size = layer_size(layer)
    out.write(outer_header("layer/layer.tar", size))
    digest = hashlib.sha256()
    got = stream_layer(layer, inline, out, digest)
    if got != size:
        raise ValueError(f"the layer came to {got} bytes, {size} planned")
    out.write(b"\0" * (padded(size) - size))
    diff_id = "sha256:" + digest.hexdigest()
    env = [
        f"PATH={venv}/bin:/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"VIRTUAL_ENV={venv}",
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
        "HOME=/tmp",
        "HF_HUB_OFFLINE=1",
        "TRANSFORMERS_OFFLINE=1",
        "HF_HOME=/tmp/hf",
        "TORCHINDUCTOR_CACHE_DIR=/tmp/inductor",
        "TRITON_CACHE_DIR=/tmp/triton",
    ]
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": [f"{venv}/bin/python"], "Cmd": [TRAIN_PATH], "Env": env,
                   "WorkingDir": "/workspace", "User": f"{uid}:{uid}"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hack/node/trainimage.py"}],
    }, sort_keys=True).encode()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [name], "Layers": ["layer/layer.tar"]}]).encode()
    total = BLOCK + padded(size)
    for fname, data in (("config.json", config), ("manifest.json", manifest)):
        h = outer_header(fname, len(data))
        out.write(h + data + b"\0" * (padded(len(data)) - len(data)))
        total += len(h) + padded(len(data))
    out.write(b"\0" * (2 * BLOCK))
    out.flush()
    return total + 2 * BLOCK, diff_id


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="trainimage.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--venv", default="/opt/torch/.venv", help="the Python environment (copied at its own path)")
    p.add_argument("--wheel", required=True, help="vramfit's wheel (hack/wheel.sh), unpacked into the environment")
    p.add_argument("--train", default=str(Path(__file__).with_name("train.py")), help=f"the demo's train.py, at {TRAIN_PATH}")
    p.add_argument("--name", default=IMAGE)
    p.add_argument("--uid", type=int, default=65532, help="the image's user (non-root)")
    p.add_argument("--out", required=True, help="the tarball, or - for stdout (a pipe into ctr images import -)")
    p.add_argument("--figures", help="also write the figures (sizes, libraries, time) as JSON here")
    a = p.parse_args(argv)
    log = lambda msg: print(f"trainimage: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.time()
    try:
        layer, inline, figures = plan(a.venv, a.wheel, a.train, a.uid, log)
        t_plan = time.time() - t0
        log(f"{len(layer.entries)} entries: environment {figures['venvBytes'] / 2**30:.2f} GiB, base "
            f"{figures.get('base')} {figures.get('baseBytes', 0) / 2**20:.0f} MiB, {figures['systemLibraries']} system "
            f"libraries, {figures['wheelFiles']} files from the wheel (listed in {t_plan:.1f}s)")
        if figures["unresolved"]:
            log(f"not found (left to the driver tree or unused): {', '.join(figures['unresolved'][:20])}")
        if figures["libraryFoldersOutsideTheDefaults"]:
            log(f"warning: libraries outside the loader's default folders: {figures['libraryFoldersOutsideTheDefaults']}")
        out = sys.stdout.buffer if a.out == "-" else open(a.out + ".tmp", "wb")
        size, diff_id = write_image(layer, inline, out, a.name, a.uid, os.path.normpath(os.path.abspath(a.venv)))
        if a.out != "-":
            out.close()
            os.replace(a.out + ".tmp", a.out)
    except (ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            log("the reader went away (ctr images import failed?)")
        else:
            log(str(exc))
        return 1
    figures.update(image=a.name, bytes=size, diffId=diff_id, seconds=round(time.time() - t0, 1), entries=len(layer.entries))
    log(f"{a.name}: {size / 2**30:.2f} GiB ({size} bytes) written in {figures['seconds']}s, layer {diff_id[:19]}")
    if a.figures:
        Path(a.figures).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
