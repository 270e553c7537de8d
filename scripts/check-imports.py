#!/usr/bin/env python3
"""Check that no module of any crate of the workspace imports, directly or
through others, a module that imports it (ARCHITECTURE.md: nothing imports
upward, no two modules import each other).

A module is a source file. File A imports file B when A names a path that
leads into B: `crate::x::y`, `super::x`, `self::x`, or `child::x` for a
module A declares, in a `use` or anywhere in the code; `crate::Item` for
an item of the crate root is an import of the root file. A module and
its descendants are one unit as seen from the parent: what a parent names
of its own children (declaring, re-exporting, wiring them) is not counted,
as Rust's privacy lets children use their parent's private helpers; what a
child takes from its parent, and every import between modules of which
neither contains the other, is. Test code (`#[cfg(test)]` modules and
files) is left out, since a test module imports what it tests. Every
strongly connected set of two or more files is reported, with the paths
that close it, and the exit status is 1.

Layers: in blkimage, `storage/` (where bytes come from) imports neither
`formats/` nor `open/`, and `formats/` does not import `open/`; an import
upward is reported as well.

Hand-written, not cargo-modules: that tool needs a nightly-free rust-analyzer
build of its own and reports circles only as a graph to read; this check is
one command in the test run (scripts/test.sh).

Usage: scripts/check-imports.py [CRATE_DIR...]   (default: every member)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def members():
    text = (ROOT / "Cargo.toml").read_text()
    m = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S)
    return [ROOT / name for name in re.findall(r'"([^"]+)"', m.group(1))]


def strip(code):
    """The code without comments, string and char literals."""
    out = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if code.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif code.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', code[i:i + 10]) and not (
            i and (code[i - 1].isalnum() or code[i - 1] == "_")
        ):
            hashes = re.match(r"r(#*)\"", code[i:]).group(1)
            end = code.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and code[i] != '"':
                i += 2 if code[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", code[i:i + 12]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", code[i:i + 12])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(code, start):
    """The index just past the `{...}` block opening at or after `start`."""
    i = code.find("{", start)
    depth = 0
    while i < len(code):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(code)


CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])")
CFG_TEST_ITEM = re.compile(r"#\[cfg\(test\)\]\s*")


def drop_tests(code):
    """`code` without its test modules; and the names of test module files."""
    test_files = set()
    while True:
        m = CFG_TEST.search(code)
        if not m:
            break
        if m.group(4) == ";":
            test_files.add(m.group(3))
            code = code[: m.start()] + code[m.end():]
        else:
            code = code[: m.start()] + code[block_end(code, m.start()):]
    return code, test_files


class Module:
    def __init__(self, path, parent, name, dir_):
        self.path = path  # the file
        self.parent = parent
        self.name = name
        self.dir = dir_  # where its children's files are
        self.children = {}
        self.code = ""


MOD_DECL = re.compile(r"(?:#\[path\s*=\s*\"([^\"]*)\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")


def load(path, parent, name, dir_, modules):
    m = Module(path, parent, name, dir_)
    modules.append(m)
    code, test_files = drop_tests(strip(path.read_text()))
    m.code = code
    for decl in MOD_DECL.finditer(code):
        child = decl.group(2)
        if child in test_files:
            continue
        for f, d in ((dir_ / f"{child}.rs", dir_ / child), (dir_ / child / "mod.rs", dir_ / child)):
            if f.exists():
                m.children[child] = load(f, m, child, d, modules)
                break
    return m


def roots(crate):
    src = crate / "src"
    found = [src / "lib.rs", src / "main.rs"]
    found += sorted((src / "bin").glob("*.rs")) + sorted((src / "bin").glob("*/main.rs"))
    return [f for f in found if f.exists()]


def use_paths(tree, prefix=""):
    """The paths of a use tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        yield prefix + tree.split(" as ")[0].strip()
        return
    head = prefix + tree[:i]
    inner = tree[i + 1: tree.rfind("}")]
    depth, start = 0, 0
    for j, c in enumerate(inner + ","):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            part = inner[start:j].strip()
            if part:
                yield from use_paths(part, head)
            start = j + 1


USE = re.compile(r"\buse\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:\s*::\s*(?:\w+|\{))+)")


def target(m, path, crate_root):
    """The module file a path leads into, from module `m`."""
    segs = [s.strip() for s in path.split("::") if s.strip()]
    if not segs:
        return None
    if segs[0] == "crate":
        at, segs = crate_root, segs[1:]
    elif segs[0] == "self":
        at, segs = m, segs[1:]
    elif segs[0] == "super":
        at = m
        while segs and segs[0] == "super":
            at, segs = at.parent, segs[1:]
            if at is None:
                return None
    elif segs[0] in m.children:
        at = m
    else:
        return None
    for s in segs:
        if s in at.children:
            at = at.children[s]
        else:
            break
    return at


def contains(a, b):
    """True if module `b` is `a` or inside it."""
    while b is not None:
        if b is a:
            return True
        b = b.parent
    return False


# Per crate directory: the layer folders of its src/, bottom first.
LAYERS = {"blkimage": ["storage", "formats", "open"]}


def layer(crate, path):
    order = LAYERS.get(crate.name, [])
    parts = path.relative_to(crate / "src").parts
    return order.index(parts[0]) if parts and parts[0] in order else None


def upward(crate, graph):
    """Imports from a layer into one above it."""
    for a, targets in graph.items():
        for b, p in targets.items():
            la, lb = layer(crate, a), layer(crate, b)
            if la is not None and lb is not None and lb > la:
                yield a, b, p


def edges(modules, crate_root):
    out = {}
    for m in modules:
        paths = set()
        for u in USE.finditer(m.code):
            paths.update(use_paths(re.sub(r"\s+", " ", u.group(1))))
        rest = USE.sub("", m.code)
        paths.update(p.group(1) for p in PATH.finditer(rest))
        for p in paths:
            t = target(m, p, crate_root)
            if t is not None and t is not m and not contains(m, t):
                out.setdefault(m.path, {}).setdefault(t.path, p)
    return out


def cycles(graph):
    """Tarjan's strongly connected components of two or more nodes."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in list(graph):
        if v not in index:
            visit(v)
    return comps


def main():
    crates = [Path(a).resolve() for a in sys.argv[1:]] or members()
    bad = 0
    for crate in crates:
        for root in roots(crate):
            modules = []
            top = load(root, None, "crate", root.parent, modules)
            if root.name not in ("lib.rs", "main.rs", "mod.rs"):
                top.dir = root.parent / root.stem
                modules.clear()
                top = load(root, None, "crate", root.parent / root.stem, modules)
            graph = edges(modules, top)
            for a, b, p in upward(crate, graph):
                bad += 1
                print(f"import upward: {a.relative_to(ROOT)} -> {b.relative_to(ROOT)}  ({p})")
            for comp in cycles(graph):
                bad += 1
                rel = lambda p: str(p.relative_to(ROOT))
                print(f"import circle of {len(comp)} files in {rel(root)}:")
                members_ = set(comp)
                for a in sorted(comp):
                    for b, p in sorted(graph.get(a, {}).items()):
                        if b in members_:
                            print(f"  {rel(a)} -> {rel(b)}  ({p})")
    if bad:
        print(f"{bad} import circle(s) or upward import(s)")
        return 1
    print("no import circle in", ", ".join(c.name for c in crates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
