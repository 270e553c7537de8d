#!/usr/bin/env python3
"""Run the shell examples of the README and the guide, and check what they print.

    scripts/test-docs.py [FILE.md...]     (default: README.md, docs/guide/*.md)

A ```console block is an example: each line starting with "$ " is a command
(a line ending with "\\", or the lines after it starting with "> ", the
shell's prompt for more, continue it), the lines after it, up to
the next command, what it prints (standard output and error together, as a
terminal shows them). In what is shown, "[..]" stands for any text within a
line (a time, a temporary name) and a line "..." for any number of lines;
a command that exits non-zero ends its output with "[exit status: N]".
Every other code block of a shell (sh, bash, shell, or lines starting with
"$ ") is refused unless an HTML comment right before it says why it is not
run: `<!-- untested: REASON -->` (it installs packages, needs a remote
host...).

HTML comments, invisible on the rendered page, set the scene:
- `<!-- doctest setup: COMMANDS -->` runs COMMANDS (bash) before the next
  block, in the page's directory;
- `<!-- doctest file: NAME -->` right before a code block writes the block
  to the file NAME there (a C or Python program the next commands run);
- `<!-- doctest cleanup: COMMANDS -->` runs COMMANDS when the page is done,
  whatever happened (servers the examples started).

Each page runs in a scratch directory of its own, its blocks in order, with
the commands built in target/release (CARGO_TARGET_DIR's release directory)
first on PATH, the C library there behind pkg-config's `blkhash`, and the
Python extension importable as `blkhash`. Needs the release build
(`cargo build --workspace --release`) and what scripts/setup.sh installs.

Why a runner of its own rather than trycmd (the well-kept crate for
examples of Rust commands): the examples are shell as users type it, with
pipes, loops, `&&`, `$(...)` and servers started in the background, which
trycmd's one-command-per-line cases do not run; they need real images that
qemu-img and qemu-io make first; and a page is one session whose examples
build on each other. Python 3's standard library only.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELLS = {"sh", "bash", "shell", "shell-session", "console", "zsh"}
TIMEOUT = 300  # seconds a command may take


class Block:
    def __init__(self, path, line, info, text, before):
        self.path, self.line, self.info, self.text = path, line, info, text
        self.before = before  # the HTML comments right before it

    def where(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse(path):
    """The page's fenced code blocks and directives, in order: a list of
    ("block", Block) and ("setup"|"cleanup", commands, where)."""
    lines = path.read_text().split("\n")
    items, comments, i = [], [], 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", line)
        if line.lstrip().startswith("<!--"):
            start = i
            text = line
            while "-->" not in text and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
            body = text.strip()[4:].rsplit("-->", 1)[0].strip()
            dm = re.match(r"doctest (setup|cleanup):\s*(.*)", body, re.S)
            if dm:
                items.append((dm.group(1), dm.group(2), f"{path.relative_to(ROOT)}:{start + 1}"))
            else:
                comments.append(body)
            i += 1
            continue
        if m:
            indent, fence, info = m.group(1), m.group(2), m.group(3).lower()
            start = i
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            items.append(("block", Block(path, start + 1, info, "\n".join(body), comments)))
            comments = []
            i += 1
            continue
        if line.strip():
            comments = []
        i += 1
    return items


def commands(block):
    """A console block's (command, expected lines) pairs."""
    out, cmd, expect, cont = [], None, [], False
    for line in block.text.split("\n"):
        if cont:
            cmd += "\n" + line
            cont = line.endswith("\\")
            continue
        if line.startswith("> ") and cmd is not None and not expect:
            cmd += "\n" + line[2:]  # a continuation, after the shell's PS2 prompt
            continue
        if line.startswith("$ "):
            if cmd is not None:
                out.append((cmd, expect))
            cmd, expect = line[2:], []
            cont = line.endswith("\\")
        elif cmd is not None:
            expect.append(line)
        elif line.strip():
            raise ValueError(f"{block.where()}: output before any command: {line!r}")
    if cmd is not None:
        out.append((cmd, expect))
    while out and out[-1][1] and not out[-1][1][-1].strip():
        out[-1][1].pop()
    return out


def line_matches(want, got):
    parts = [re.escape(p) for p in want.split("[..]")]
    return re.fullmatch(".*".join(parts), got) is not None


def matches(want, got):
    """want (lines with [..] and ... lines) against got (lines)."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and line_matches(want[0], got[0]) and matches(want[1:], got[1:])


def environment(scratch):
    """PATH with the release build first, pkg-config's blkhash and the
    Python module pointing at it, TMPDIR and XDG_STATE_HOME (where blksync
    records the copies it wrote) inside the page's directory."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    release = (target if target.is_absolute() else ROOT / target) / "release"
    for exe in ("blksum", "blkmap", "blkdiff", "blksync", "libblkhash.so"):
        if not (release / exe).exists():
            sys.exit(f"test-docs: {release / exe} missing: cargo build --workspace --release")
    prefix = scratch / ".prefix"
    lib = prefix / "lib"
    (lib / "pkgconfig").mkdir(parents=True)
    (lib / "libblkhash.so.0").symlink_to(release / "libblkhash.so")
    (lib / "libblkhash.so").symlink_to("libblkhash.so.0")
    (lib / "libblkhash.a").symlink_to(release / "libblkhash.a")
    version = re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
    pc = (ROOT / "libblkhash/blkhash.pc.in").read_text()
    for k, v in {"PREFIX": prefix, "LIBDIR": lib, "INCLUDEDIR": ROOT / "libblkhash/include",
                 "VERSION": version}.items():
        pc = pc.replace(f"@{k}@", str(v))
    (lib / "pkgconfig/blkhash.pc").write_text(pc)
    py = prefix / "python"
    py.mkdir()
    if (release / "libblkhash_py.so").exists():
        (py / "blkhash.abi3.so").symlink_to(release / "libblkhash_py.so")
    tmp = scratch / ".tmp"
    tmp.mkdir()
    env = dict(os.environ)
    env.update({
        "PATH": f"{release}:{env.get('PATH', '/usr/bin:/bin')}",
        "PKG_CONFIG_PATH": str(lib / "pkgconfig"),
        "LD_LIBRARY_PATH": str(lib),
        "PYTHONPATH": str(py),
        "TMPDIR": str(tmp),
        "XDG_STATE_HOME": str(scratch / ".state"),
        "LC_ALL": "C.UTF-8",
        "COLUMNS": "100",
    })
    return env


def bash(script, cwd, env):
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=TIMEOUT)


def run_page(path):
    """Run a page's examples: (commands run, failures)."""
    items = parse(path)
    failures, ran = [], 0
    scratch = Path(tempfile.mkdtemp(prefix="docs-"))
    cleanups = [(item[1], item[2]) for item in items if item[0] == "cleanup"]
    try:
        env = environment(scratch)
        pending = None  # a file directive waiting for its block
        for kind, *rest in items:
            if kind == "setup":
                script, where = rest
                p = bash(script, scratch, env)
                if p.returncode != 0:
                    failures.append(f"{where}: setup failed (exit {p.returncode}):\n{p.stdout}")
                    break
                continue
            if kind != "block":
                continue
            (block,) = rest
            files = [c for c in block.before if c.startswith("doctest file:")]
            untested = [c for c in block.before if c.startswith("untested:")]
            if files:
                name = files[0].split(":", 1)[1].strip()
                (scratch / name).write_text(block.text + "\n")
                continue
            is_shell = block.info in SHELLS or any(
                line.startswith("$ ") for line in block.text.split("\n"))
            if not is_shell:
                continue
            if untested:
                if not untested[0].split(":", 1)[1].strip():
                    failures.append(f"{block.where()}: `untested:` needs a reason")
                continue
            if block.info != "console":
                failures.append(f"{block.where()}: a shell example that is not run: make it a "
                                f"```console block (commands and output) or say why not "
                                f"(<!-- untested: REASON -->)")
                continue
            for cmd, want in commands(block):
                ran += 1
                try:
                    p = bash(cmd, scratch, env)
                except subprocess.TimeoutExpired:
                    failures.append(f"{block.where()}: `{cmd}` took over {TIMEOUT} s")
                    continue
                got = [line.rstrip() for line in p.stdout.rstrip("\n").split("\n")] \
                    if p.stdout.strip("\n") else []
                if p.returncode != 0:
                    got.append(f"[exit status: {p.returncode}]")
                if not matches([w.rstrip() for w in want], got):
                    failures.append(
                        f"{block.where()}: `{cmd}` printed\n"
                        + "".join(f"    {g}\n" for g in got)
                        + "  where the page shows\n"
                        + "".join(f"    {w}\n" for w in want))
    finally:
        for script, where in cleanups:
            try:
                bash(script, scratch, env)
            except Exception as e:  # a cleanup that fails must not hide the rest
                failures.append(f"{where}: cleanup: {e}")
        shutil.rmtree(scratch, ignore_errors=True)
    return ran, failures


def main():
    pages = [Path(a).resolve() for a in sys.argv[1:]] or \
        [ROOT / "README.md", *sorted((ROOT / "docs/guide").glob("*.md"))]
    failed = 0
    for page in pages:
        ran, failures = run_page(page)
        name = page.relative_to(ROOT)
        if failures:
            failed += 1
            print(f"docs: {name}: {ran} commands, {len(failures)} failed:")
            for f in failures:
                print("  " + f.replace("\n", "\n  ").rstrip())
        else:
            print(f"docs: {name}: {ran} commands ok")
    print(f"docs: {len(pages) - failed} pages ok, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
