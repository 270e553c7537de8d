#!/usr/bin/env python3
"""Charts of the measured figures: `python3 bench/run.py --plots`.

Draws nothing that was not measured: the charts are made from the reports
kept in docs/bench/ (what `bench/run.py --out` wrote), and each one names
its report, date, commit and machine. Runs nothing else.

- A chart per case (docs/images/CASE.png): the case's section of the
  newest report that has one (by the report's Date line), its tables of
  median times as horizontal bars, one panel per table; ours in blue, the
  reference blksum 0.11 in orange, the other tools (sha256sum, b3sum, dd,
  fio, qemu-img, cp) in grey.
- lib (docs/images/lib.png): throughput against digest threads, from the
  library benchmark's table: the Rust library, the C API (simple and
  async) and the reference, for data hashed with sha256 and blake3.
- The README's chart (docs/images/readme.png): 2 GiB of random data and
  2 GiB of half data, half holes, from the random and holes cases of the
  newest report that holds both: blksum against the reference, sha256sum
  and b3sum.

Needs matplotlib: `bench/run.py --plots` runs this in a venv of the
bench's own (in --dir) where matplotlib is installed.
"""

import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "docs" / "bench"
OUT = ROOT / "docs" / "images"

# A case by the start of its section title in the reports.
CASES = {
    "Random data": "random",
    "Half data, half holes": "holes",
    "Written zeros": "zero",
    "Empty sparse image": "empty",
    "qcow2, half allocated": "qcow2",
    "Compressed qcow2": "compressed",
    "NBD: qemu-nbd exports": "nbd",
    "An image hashed in": "ranges",
    "Direct I/O against": "direct",
    "Incremental maps": "dirty",
    "Delta copy: blksync": "sync",
    "Delta copy to an NBD export": "sync_nbd",
    "Remote NBD exports": "remote",
    "Library benchmark": "lib",
}
COLORS = {"ours": "#1f77b4", "ref": "#ff7f0e", "peer": "#8c8c8c"}


class Report:
    """A report's header lines and its sections: title -> (panel title,
    header, rows) for each table."""

    def __init__(self, path):
        self.path = path
        text = path.read_text()
        head = lambda key: (re.search(rf"^- {key}: (.*)$", text, re.M) or [None, "?"])[1]
        self.date = head("Date")
        self.commit = head("Commit")
        host = head("Host")
        cpu = re.search(r"CPU ([^,]*)", host)
        self.cpu = cpu[1] if cpu else host
        self.sections = {}
        section = panel = None
        lines = text.split("\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("## "):
                section, panel = line[3:].strip(), None
                self.sections[section] = []
            elif line.startswith("### "):
                panel = line[4:].strip()
            elif line.startswith("| ") and section and i + 1 < len(lines) \
                    and lines[i + 1].startswith("|:"):
                header = cells(line)
                rows = []
                i += 2
                while i < len(lines) and lines[i].startswith("|"):
                    rows.append(cells(lines[i]))
                    i += 1
                self.sections[section].append((panel, header, rows))
                continue
            i += 1

    def source(self):
        return (f"{self.path.name}: {self.date[:10]}, commit {self.commit}, "
                f"{self.cpu}")


def cells(line):
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def number(text):
    try:
        return float(text.replace(",", "").rstrip("x×"))
    except ValueError:
        return None


def newest(reports, case):
    """The newest report with a section of `case`: (report, title)."""
    found = []
    for r in reports:
        for title in r.sections:
            for prefix, name in CASES.items():
                if title.startswith(prefix) and name == case:
                    found.append((r.date, r, title))
    if not found:
        return None, None
    _, r, title = max(found, key=lambda f: f[0])
    return r, title


def kind(command):
    c = command.strip("`").lower()
    if c.startswith("ref"):
        return "ref"
    if re.match(r"(blksum|blkmap|blksync|blkdiff|\d+ × blkmap)", c):
        return "ours"
    return "peer"


def bars(ax, rows, title):
    """Median times of `rows` (command, median s, ...) as horizontal bars."""
    data = [(r[0], number(r[1])) for r in rows if len(r) > 1 and number(r[1]) is not None]
    names = [d[0].replace("`", "") for d in data][::-1]
    times = [d[1] for d in data][::-1]
    colors = [COLORS[kind(d[0])] for d in data][::-1]
    ax.barh(range(len(times)), times, color=colors)
    ax.set_yticks(range(len(times)), names, fontsize=8)
    if times and max(times) / max(min(times), 1e-9) > 100:
        ax.set_xscale("log")
    for y, t in enumerate(times):
        ax.text(t, y, f" {t:.3g} s", va="center", fontsize=7)
    ax.set_xlabel("median time, s (less is better)", fontsize=8)
    ax.margins(x=0.15)
    if title:
        ax.set_title(title, fontsize=9)


def save(fig, name, source):
    fig.text(0.01, 0.005, f"Data: docs/bench/{source}", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plots: {path.relative_to(ROOT)} ({source})")


def case_chart(reports, case):
    r, title = newest(reports, case)
    if r is None:
        print(f"plots: {case}: no report has it", file=sys.stderr)
        return
    tables = [t for t in r.sections[title] if t[1][:2] == ["command", "median s"]]
    if not tables:
        return
    n = len(tables)
    cols = 2 if n > 2 else 1
    rows = (n + cols - 1) // cols
    height = sum(max(len(t[2]), 2) for t in tables[::cols]) * 0.32 + 0.9 * rows + 0.6
    fig, axes = plt.subplots(rows, cols, figsize=(9 if cols == 1 else 12, height), squeeze=False)
    for ax, (panel, _, trows) in zip(axes.flat, tables):
        bars(ax, trows, panel)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title if len(title) < 110 else title[:107] + "...", fontsize=10)
    save(fig, case, r.source())


def lib_chart(reports):
    r, title = newest(reports, "lib")
    if r is None:
        return
    (panel, header, rows), *_ = r.sections[title]
    col = {h: i for i, h in enumerate(header)}
    series = [("Rust GB/s", "Rust library", COLORS["ours"], "o-"),
              ("C async GB/s", "C API, async", "#2ca02c", "s-"),
              ("C simple GB/s", "C API, simple", "#98df8a", "s--"),
              ("ref GB/s", "reference 0.11", COLORS["ref"], "^-")]
    digests = sorted({row[col["digest"]] for row in rows if row[col["input"]] == "data"})
    fig, axes = plt.subplots(1, len(digests), figsize=(5 * len(digests), 3.6), squeeze=False)
    for ax, digest in zip(axes.flat, digests):
        mine = [row for row in rows if row[col["input"]] == "data" and row[col["digest"]] == digest]
        threads = [int(row[col["threads"]]) for row in mine]
        for key, label, color, style in series:
            if key in col:
                ax.plot(threads, [number(row[col[key]]) for row in mine], style, color=color,
                        label=label)
        ax.set_title(f"data, {digest}", fontsize=9)
        ax.set_xlabel("digest threads", fontsize=8)
        ax.set_ylabel("GB/s (more is better)", fontsize=8)
        ax.set_xticks(threads)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle("The library alone: throughput against threads (1 MiB buffers, 64 KiB blocks)",
                 fontsize=10)
    save(fig, "lib", r.source())


def readme_chart(reports):
    cases = (("random", "2 GiB of random data"), ("holes", "2 GiB, half data, half holes"))
    # Both panels from one run, so that they compare: the newest report
    # with both cases (a report of a side measure may hold one of them).
    both = [r for r in reports
            if all(newest([r], case)[0] is not None for case, _ in cases)]
    if not both:
        return
    report = max(both, key=lambda r: r.date)
    panels = []
    for case, label in cases:
        r, title = newest([report], case)
        (_, _, rows), *_ = r.sections[title]
        keep = [row for row in rows if "direct" not in row[0] and not row[0].startswith("dd")]
        panels.append((label, keep, r))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), squeeze=False)
    for ax, (label, rows, _) in zip(axes.flat, panels):
        bars(ax, rows, label)
    fig.suptitle("Time to hash a disk image: blksum (blue), the reference blksum 0.11 "
                 "(orange), other tools (grey)", fontsize=10)
    sources = sorted({p[2].source() for p in panels})
    save(fig, "readme", "; ".join(sources))


def main():
    reports = [Report(p) for p in sorted(REPORTS.glob("*.md"))]
    for case in CASES.values():
        if case == "lib":
            lib_chart(reports)
        else:
            case_chart(reports, case)
    readme_chart(reports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
