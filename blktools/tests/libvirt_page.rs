//! docs/guide/libvirt.md run as a reader runs it: every shell example of
//! the page, read from the page (so the two cannot drift), in the page's
//! order, in one shell session (a `cd` or a file of one example is there
//! for the next), on one VM, `vm1`, whose disk `vda` (virtio-blk, what
//! most VMs have) the guest writes to before each example.
//!
//! The session runs in the mount namespace of the test's own libvirtd
//! ([`Libvirtd::inside`]), where `virsh` and virtnbdbackup reach it with
//! no URI as the page's commands do, where /run and /var/tmp are private
//! and the VM's image is /var/lib/libvirt/images/vm1.qcow2. The one
//! change made to the page's text: `/backup/` and `/restore/` become
//! directories of the test (the host's root is not the test's to write).
//! An example preceded by a comment saying "not run by
//! blktools/tests/libvirt_page.rs" (the page's start of a libvirtd) is
//! left out.
//!
//! Checked: every `sh` example succeeds; every `console` example prints
//! what the page shows (`[..]` any text within a line, a line `...` any
//! lines, `[exit status: N]` after the output of a command that fails, as
//! scripts/test-docs.py reads them); every checksum line an example
//! writes into a list (`> X.sum`, `>> SUMS`) is there, one a redirection,
//! and is the checksum of the disk at that moment: blksum of a pull
//! backup's export the test starts right after the example. Then the
//! page's list, in a copy of the backup directory whose full stream has
//! one byte changed, reports every line FAILED (exit 1): the list names
//! the files relative to itself, so it checks the copy.

use crate::common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};
use testkit::libvirt::{Domain, Libvirtd, have_libvirt};

const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guide/libvirt.md");

/// What a comment before an example says to leave it out.
const SKIP: &str = "not run by blktools/tests/libvirt_page.rs";

/// How long one example may take.
const TIMEOUT: Duration = Duration::from_secs(300);

/// The guest's first write, found in the full stream to damage a copy.
const FIRST: (u8, &str) = (0x5a, "write -P 0x5a 0 1M");

/// A shell example of the page.
struct Example {
    /// Its line in the page.
    line: usize,
    /// A ```console example (commands after `$ `, their output below), else
    /// a script (```sh) that must succeed.
    console: bool,
    text: String,
}

/// The page's shell examples, in order, but those a comment right before
/// leaves out ([`SKIP`]).
fn examples(page: &str) -> Vec<Example> {
    let lines: Vec<&str> = page.lines().collect();
    let (mut out, mut comment, mut i) = (Vec::new(), String::new(), 0);
    while i < lines.len() {
        let line = lines[i].trim_start();
        if line.starts_with("<!--") {
            comment = line.to_string();
            while !comment.contains("-->") && i + 1 < lines.len() {
                i += 1;
                comment = format!("{comment}\n{}", lines[i]);
            }
        } else if let Some(info) = line.strip_prefix("```") {
            let start = i;
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                body.push(lines[i]);
                i += 1;
            }
            let shell = matches!(info.trim(), "sh" | "bash" | "shell" | "console");
            if shell && !comment.contains(SKIP) {
                out.push(Example {
                    line: start + 1,
                    console: info.trim() == "console",
                    text: body.join("\n"),
                });
            }
            comment.clear();
        } else if !line.is_empty() {
            comment.clear();
        }
        i += 1;
    }
    out
}

/// A console example's commands, each with the lines it must print (as
/// scripts/test-docs.py reads them: `\` or `> ` lines continue a command).
fn commands(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut cont = false;
    for line in text.lines() {
        match out.last_mut() {
            Some((cmd, want)) if cont || (line.starts_with("> ") && want.is_empty()) => {
                let more = if cont { line } else { &line[2..] };
                *cmd = format!("{cmd}\n{more}");
                cont = line.ends_with('\\');
                continue;
            }
            _ => {}
        }
        if let Some(cmd) = line.strip_prefix("$ ") {
            out.push((cmd.to_string(), Vec::new()));
            cont = cmd.ends_with('\\');
        } else {
            let (_, want) = out.last_mut().expect("output before any command");
            want.push(line.trim_end().to_string());
        }
    }
    for (_, want) in &mut out {
        while want.last().is_some_and(|l| l.is_empty()) {
            want.pop();
        }
    }
    out
}

/// `want` (with `[..]` for any text) matches the line `got`.
fn line_matches(want: &str, got: &str) -> bool {
    let parts: Vec<&str> = want.split("[..]").collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return want == got;
    }
    if !got.starts_with(first) || !got[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &got[first.len()..got.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(k) => rest = &rest[k + p.len()..],
            None => return false,
        }
    }
    true
}

/// `want` (lines, a line `...` for any lines) matches `got`.
fn output_matches(want: &[String], got: &[String]) -> bool {
    match want.split_first() {
        None => got.is_empty(),
        Some((w, rest)) if w == "..." => (0..=got.len()).any(|k| output_matches(rest, &got[k..])),
        Some((w, rest)) => {
            !got.is_empty() && line_matches(w, &got[0]) && output_matches(rest, &got[1..])
        }
    }
}

/// One bash session in libvirtd's namespace, fed a script at a time.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    dir: PathBuf,
    n: usize,
}

impl Shell {
    /// bash in `lv`'s namespace, in `work`, with the commands built for
    /// this test first on PATH and TMPDIR in `dir` (scripts go there too).
    fn start(lv: &Libvirtd, dir: &Path, work: &Path) -> Shell {
        let bin = Path::new(BLKMAP).parent().unwrap();
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        let mut child = lv
            .inside("bash")
            .args(["--norc", "--noprofile"])
            .env("PATH", path)
            .env("TMPDIR", &tmp)
            .env("LC_ALL", "C.UTF-8")
            .env("COLUMNS", "100")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("nsenter runs: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take().unwrap();
        let mut sh = Shell {
            child,
            stdin,
            lines,
            dir: dir.to_path_buf(),
            n: 0,
        };
        // Standard error with standard output, in order, as a terminal shows.
        let (_, code) = sh.run(&format!("exec 2>&1; cd '{}'", work.display()), false);
        assert_eq!(code, 0);
        sh
    }

    /// Run `script` in the session (its standard input empty): what it
    /// printed and its exit status. `strict`: under `set -e`, a command that
    /// fails ends the session, and the test with what it printed.
    fn run(&mut self, script: &str, strict: bool) -> (Vec<String>, i32) {
        self.n += 1;
        let file = self.dir.join(format!("example-{}.sh", self.n));
        std::fs::write(&file, format!("{script}\n")).unwrap();
        let (on, off) = if strict {
            ("set -e; ", "; set +e")
        } else {
            ("", "")
        };
        let line = format!(
            "{on}. '{}' </dev/null{off}\necho \"@@end:$?\"\n",
            file.display()
        );
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        let (deadline, mut got) = (Instant::now() + TIMEOUT, Vec::new());
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => match l.split_once("@@end:") {
                    Some((before, code)) => {
                        if !before.is_empty() {
                            got.push(before.to_string());
                        }
                        return (got, code.trim().parse().unwrap());
                    }
                    None => got.push(l.trim_end().to_string()),
                },
                Err(RecvTimeoutError::Timeout) => panic!("{script}: over {TIMEOUT:?}: {got:#?}"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "{script}\nfailed (set -e ended the session):\n{}",
                        got.join("\n")
                    )
                }
            }
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.stdin.write_all(b"exit\n");
        let _ = self.stdin.flush();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The checksum lists under `dirs` (files named `SUMS` or `*.sum`) and
/// their lines.
fn lists(dirs: &[&Path]) -> BTreeMap<PathBuf, Vec<String>> {
    fn walk(d: &Path, out: &mut BTreeMap<PathBuf, Vec<String>>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                walk(&p, out);
            } else if name == "SUMS" || name.ends_with(".sum") {
                let text = std::fs::read_to_string(&p).unwrap();
                out.insert(p, text.lines().map(str::to_string).collect());
            }
        }
    }
    let mut out = BTreeMap::new();
    for d in dirs {
        walk(d, &mut out);
    }
    out
}

/// The lines of `after` that `before` did not have (all of a file that
/// changed otherwise than by lines added).
fn new_lines(
    before: &BTreeMap<PathBuf, Vec<String>>,
    after: &BTreeMap<PathBuf, Vec<String>>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (p, lines) in after {
        let old = before.get(p).map_or(&[][..], Vec::as_slice);
        let from = if lines.starts_with(old) { old.len() } else { 0 };
        out.extend(lines[from..].iter().cloned());
    }
    out
}

/// How many redirections of `script` write into a checksum list (`> X.sum`,
/// `>> SUMS`): the lines it must add.
fn list_writes(script: &str) -> usize {
    let words: Vec<&str> = script.split_whitespace().collect();
    let targets = words.iter().enumerate().filter_map(|(i, w)| {
        let rest = w.trim_start_matches('>');
        match (w.len() - rest.len(), rest) {
            (1 | 2, "") => words.get(i + 1).copied(),
            (1 | 2, rest) => Some(rest),
            _ => None,
        }
    });
    targets
        .map(|t| t.trim_end_matches([';', '&', '|', ')']))
        .filter(|t| t.ends_with("SUMS") || t.ends_with(".sum"))
        .count()
}

/// blksum's checksum of the disk as it is: a pull backup of the test's
/// own (no checkpoint: the page's chains are left alone) read over NBD.
fn disk_checksum(d: &Path, dom: &Domain) -> String {
    let blksum = Path::new(BLKMAP).with_file_name("blksum");
    let sock = d.join("truth.sock");
    dom.backup_begin(&sock, None, None);
    let url = format!("nbd+unix:///{}?socket={}", dom.target(), sock.display());
    let o = run(s(&blksum), &[&url]);
    dom.backup_end();
    assert_eq!(o.code, 0, "blksum {url}: {}", o.stderr);
    o.stdout.split_whitespace().next().unwrap().to_string()
}

/// The page's example `ex` run in `sh`: a script must succeed, a console
/// example's commands print what the page shows.
fn run_example(sh: &mut Shell, ex: &Example) {
    if !ex.console {
        let (got, code) = sh.run(&ex.text, true);
        assert_eq!(
            code,
            0,
            "libvirt.md:{}: {}\n{}",
            ex.line,
            ex.text,
            got.join("\n")
        );
        return;
    }
    for (cmd, want) in commands(&ex.text) {
        let (mut got, code) = sh.run(&cmd, false);
        // As test-docs.py: the output's last newlines are not lines.
        while got.last().is_some_and(|l| l.is_empty()) {
            got.pop();
        }
        if code != 0 {
            got.push(format!("[exit status: {code}]"));
        }
        assert!(
            output_matches(&want, &got),
            "libvirt.md:{}: `{cmd}` printed\n{}\nwhere the page shows\n{}",
            ex.line,
            got.join("\n"),
            want.join("\n")
        );
    }
}

#[test]
fn libvirt_page_in_order() {
    if !have_libvirt() || !have_qemu() {
        return;
    }
    let blksum = Path::new(BLKMAP).with_file_name("blksum");
    assert!(
        blksum.exists(),
        "{blksum:?}: the page runs it (cargo build -p blksum)"
    );
    let dir = crate::libvirt::short_scratch();
    let d = dir.path();
    let lv = Libvirtd::start(&d.join("lv"));
    let images = d.join("lv/lib/images");
    std::fs::create_dir_all(&images).unwrap();
    testkit::tools::create(&images.join("vm1.qcow2"), "qcow2", &[], "64M");
    let inside = Path::new("/var/lib/libvirt/images/vm1.qcow2");
    let dom = Domain::start_virtio(&lv, "vm1", inside);
    dom.write(FIRST.1);

    let page = std::fs::read_to_string(PAGE).unwrap();
    let (backup, restore) = (d.join("backup"), d.join("restore"));
    let page = page
        .replace("/backup/", &format!("{}/", backup.display()))
        .replace("/restore/", &format!("{}/", restore.display()));
    let all = examples(&page);
    assert!(all.len() >= 10, "libvirt.md: {} examples", all.len());
    let work = d.join("work");
    std::fs::create_dir(&work).unwrap();
    let mut sh = Shell::start(&lv, d, &work);
    for (i, ex) in all.iter().enumerate() {
        // The guest writes between the examples, as a running VM does.
        dom.write(&format!("write -P {:#x} {}M 64k", 0x40 + i, 2 + 2 * i));
        let before = lists(&[&work, &backup]);
        run_example(&mut sh, ex);
        let added = new_lines(&before, &lists(&[&work, &backup]));
        assert_eq!(
            added.len(),
            list_writes(&ex.text),
            "libvirt.md:{}: {added:?}",
            ex.line
        );
        if !added.is_empty() {
            let sum = disk_checksum(d, &dom);
            for l in &added {
                assert!(
                    l.starts_with(&format!("{sum}  ")),
                    "libvirt.md:{}: {l}",
                    ex.line
                );
            }
        }
    }
    drop(sh);
    damaged_copy(d, &backup.join("vm1"));
    drop(dom);
    drop(lv);
}

/// The page's list `SUMS` in a copy of `bk` whose full stream has one byte
/// of the guest's data changed: every line FAILED (the incrementals read
/// over it), exit 1; the originals still OK.
fn damaged_copy(d: &Path, bk: &Path) {
    let blksum = Path::new(BLKMAP).with_file_name("blksum");
    let copy = d.join("copy");
    sh("cp", &["-a", s(bk), s(&copy)]);
    let full = copy.join("vda.full.data");
    let mut bytes = std::fs::read(&full).unwrap();
    let at = bytes
        .windows(65536)
        .position(|w| w.iter().all(|&b| b == FIRST.0))
        .expect("the first write in the full stream");
    bytes[at + 4096] ^= 1;
    std::fs::write(&full, bytes).unwrap();
    let check = |dir: &Path| {
        let o = std::process::Command::new(&blksum)
            .args(["-c", "SUMS"])
            .current_dir(dir)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (code, out) = check(&copy);
    assert_eq!(code, Some(1), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 2, "{out}");
    assert!(lines.iter().all(|l| l.ends_with(": FAILED")), "{out}");
    let (code, out) = check(bk);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.lines().all(|l| l.ends_with(": OK")), "{out}");
}

#[test]
fn console_examples_read_as_test_docs_reads_them() {
    let c = commands("$ a \\\n  b\nout\n$ c\n> d\n[..] x\n\n");
    assert_eq!(c[0], ("a \\\n  b".to_string(), vec!["out".to_string()]));
    assert_eq!(c[1], ("c\nd".to_string(), vec!["[..] x".to_string()]));
    assert!(line_matches("a [..] c[..]", "a b c d"));
    assert!(!line_matches("a [..] c", "a b c d"));
    let got = ["x".to_string(), "y".to_string(), "z".to_string()];
    assert!(output_matches(
        &["x".into(), "...".into(), "z".into()],
        &got
    ));
    assert!(!output_matches(&["x".into(), "z".into()], &got));
    assert_eq!(
        list_writes("a >> SUMS && b > cp1.sum; c > x.map 2>&1 >>y.sum"),
        3
    );
}
