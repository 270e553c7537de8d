//! Helpers shared by the command tests.
#![allow(dead_code)]

pub mod nbd;
pub mod progress;
pub mod qemu;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
#[allow(unused_imports)] // each test file uses a part
pub use testkit::tools::{have, require};

thread_local! {
    /// The TMPDIR of the blksum runs of this thread's test, if it chose one.
    static TMPDIR: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// Run this thread's blksum commands with TMPDIR=`dir` (created): a test
/// that checks what blksum leaves in its temporary directory looks at its
/// own, never at one that tests running beside it use.
pub fn use_tmpdir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    TMPDIR.with(|t| *t.borrow_mut() = Some(dir.to_path_buf()));
}

/// The blksum binary built by cargo for these tests (with the TMPDIR of
/// [`use_tmpdir`], if this thread set one).
pub fn blksum() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blksum"));
    TMPDIR.with(|t| {
        if let Some(d) = &*t.borrow() {
            cmd.env("TMPDIR", d);
        }
    });
    cmd
}

/// Run blksum with `args`, standard input from `stdin` (or nothing).
pub fn run(args: &[&str], stdin: Option<&Path>) -> Output {
    let mut cmd = blksum();
    cmd.args(args);
    cmd.stdin(match stdin {
        Some(p) => Stdio::from(std::fs::File::open(p).unwrap()),
        None => Stdio::null(),
    });
    cmd.output().expect("blksum runs")
}

/// Run blksum with `args`, the bytes of `file` written to a real pipe on its
/// standard input.
pub fn run_pipe(args: &[&str], file: &Path) -> Output {
    let mut child = blksum()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("blksum runs");
    let mut stdin = child.stdin.take().unwrap();
    let mut f = std::fs::File::open(file).unwrap();
    let writer = std::thread::spawn(move || std::io::copy(&mut f, &mut stdin).map(|_| ()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    out
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Build the image of `recipe` in `dir`, named after its index.
pub fn image(dir: &Path, name: &str, recipe: &str) -> PathBuf {
    let path = dir.join(name);
    testkit::Recipe::parse(recipe)
        .unwrap()
        .write_image(&path)
        .unwrap();
    path
}
