#!/usr/bin/env python3
"""The module dependency listing of docs/architecture.md.

Reads the Rust sources (test code left out: `*_tests.rs`, `tests.rs` and what
follows `#[cfg(test)]`) and lists, for each top-level module of src/ and for
each crate of the workspace, what it imports. With --check it fails when the
listing in docs/architecture.md differs from the sources, when a module below
the controller imports controller/, when src/ has a cycle between top-level
modules, when alloc-core, alloc-ffi or vmm depend on the vramfit crate, or
when a unit test module is written inline (tests of `foo.rs` live in
`foo_tests.rs` beside it, of a folder's `mod.rs` in `mod_tests.rs`).

    hack/modgraph.py            # print the listing
    hack/modgraph.py --write    # replace it in docs/architecture.md
    hack/modgraph.py --check    # CI
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- modgraph:begin (hack/modgraph.py --write) -->"
END = "<!-- modgraph:end -->"
# Who may import controller/: the binary's entry and the command line.
CONTROLLER_IMPORTERS = {"cli", "main"}
# Crates that must not depend on the vramfit crate.
SMALL_CRATES = ["alloc-core", "alloc-ffi", "vmm"]

USE_CRATE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
USE_GROUP = re.compile(r"\buse\s+crate::\{([^;]*)\};", re.S)
USE_VRAMFIT = re.compile(r"\bvramfit::([a-z_][a-z0-9_]*)")
USE_VRAMFIT_GROUP = re.compile(r"\buse\s+vramfit::\{([^;]*)\};", re.S)
INLINE_TESTS = re.compile(r"^\s*mod\s+[a-z_]*tests\s*\{", re.M)
TEST_CUT = re.compile(r"^\s*#\[cfg\(test\)\]\s*\n(\s*#\[path[^\n]*\n)?\s*(pub\s+)?mod\s+tests\b", re.M)


def production_text(path: Path) -> str:
    text = path.read_text()
    cut = TEST_CUT.search(text)
    if cut:
        text = text[: cut.start()]
    # Comments do not import.
    return re.sub(r"//[^\n]*", "", text)


def is_test_file(path: Path) -> bool:
    return path.name == "tests.rs" or path.name.endswith("_tests.rs")


def heads(group: str) -> set[str]:
    names = set()
    depth = 0
    token = ""
    for ch in group + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            head = token.strip().split("::")[0].strip()
            if head and head != "self":
                names.add(head.split(" ")[0])
            token = ""
            continue
        if depth == 0 or ch not in "{}":
            token += ch if depth == 0 else ""
    return names


def top_module(src: Path, path: Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0].removesuffix(".rs") if len(rel.parts) > 1 else rel.stem


def src_graph() -> dict[str, set[str]]:
    src = ROOT / "src"
    modules = {p.stem for p in src.glob("*.rs") if not is_test_file(p)}
    modules |= {p.name for p in src.iterdir() if p.is_dir()}
    modules.discard("lib")
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in sorted(src.rglob("*.rs")):
        if is_test_file(path):
            continue
        module = top_module(src, path)
        if module == "lib":
            continue
        text = production_text(path)
        if module == "main":
            found = {m for m in USE_VRAMFIT.findall(text)}
            for g in USE_VRAMFIT_GROUP.findall(text):
                found |= heads(g)
        else:
            found = set(USE_CRATE.findall(text))
            for g in USE_GROUP.findall(text):
                found |= heads(g)
        graph[module] |= {m for m in found if m in modules and m != module}
    return graph


def crate_deps() -> dict[str, list[str]]:
    deps = {}
    for crate in ["alloc-core", "vmm", "alloc-ffi", "agent", "."]:
        text = (ROOT / crate / "Cargo.toml").read_text()
        name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
        section = re.search(r"^\[dependencies\]\n(.*?)(^\[|\Z)", text, re.M | re.S).group(1)
        local = re.findall(r'^([a-z0-9_-]+)\s*=\s*\{[^}]*path\s*=', section, re.M)
        deps[name] = sorted(local)
    return deps


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def so_tree() -> str:
    try:
        out = subprocess.run(
            ["cargo", "tree", "-p", "vramfit-alloc", "-e", "normal", "--prefix", "none", "--offline"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"cargo tree failed: {e}")
    crates = sorted({" ".join(line.split()[:2]) for line in out.splitlines() if line.strip()})
    return f"{len(crates)} crates: " + ", ".join(crates)


def listing() -> str:
    graph = src_graph()
    lines = ["```text", "src/ (top-level modules; what each imports, tests left out)"]
    for m in sorted(graph):
        lines.append(f"  {m:<12} -> {', '.join(sorted(graph[m])) or '(nothing in src/)'}")
    lines.append("")
    lines.append("workspace crates (path dependencies)")
    for name, deps in crate_deps().items():
        lines.append(f"  {name:<20} -> {', '.join(deps) or '(none)'}")
    lines.append("")
    lines.append("libvramfit_alloc.so (vramfit-alloc), normal dependencies:")
    lines.append("  " + so_tree())
    lines.append("```")
    return "\n".join(lines)


def problems() -> list[str]:
    graph = src_graph()
    out = []
    for m, deps in sorted(graph.items()):
        if "controller" in deps and m not in CONTROLLER_IMPORTERS:
            out.append(f"src/{m} imports controller/ (only {sorted(CONTROLLER_IMPORTERS)} may)")
    for c in cycles(graph):
        out.append("cycle in src/: " + " -> ".join(c))
    for root in ["src", "agent/src", "alloc-core/src", "alloc-ffi/src", "vmm/src"]:
        for path in sorted((ROOT / root).rglob("*.rs")):
            if INLINE_TESTS.search(path.read_text()):
                rel = path.relative_to(ROOT)
                out.append(f"{rel}: unit tests go in {path.stem}_tests.rs beside it, not inline")
    deps = crate_deps()
    for crate in SMALL_CRATES:
        text = (ROOT / crate / "Cargo.toml").read_text()
        name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
        if "vramfit" in deps[name]:
            out.append(f"{crate} depends on the vramfit crate")
    return out


def main() -> int:
    text = listing()
    if "--write" in sys.argv:
        doc = DOC.read_text()
        start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
        return 0
    if "--check" in sys.argv:
        bad = problems()
        doc = DOC.read_text()
        start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        if doc[start:end].strip() != text.strip():
            bad.append("docs/architecture.md's listing is stale: run hack/modgraph.py --write")
        for b in bad:
            print(b, file=sys.stderr)
        return 1 if bad else 0
    print(text)
    for b in problems():
        print("PROBLEM:", b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
