//! Helpers shared by the command tests.
#![allow(dead_code)]

pub mod hostile;
pub mod nbd;
pub mod qemu;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The blksum binary built by cargo for these tests.
pub fn blksum() -> Command {
    Command::new(env!("CARGO_BIN_EXE_blksum"))
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

/// True if `prog` can be run (found on PATH).
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}
