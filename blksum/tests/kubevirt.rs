//! blksum of what a KubeVirt user checks: a block device's first bytes
//! (`--size`: a Block PVC larger than the image CDI wrote to it) and
//! standalone backups named as a chain (`--chain`), against the image and
//! against QEMU's reading of the files chained with `qemu-img rebase -u`.

use crate::common::*;
use std::path::Path;
use testkit::tools::{create, qemu_img_in, qemu_io, scratch};

fn sum(args: &[&str]) -> String {
    let out = run(args, None);
    assert!(out.status.success(), "blksum {args:?}: {}", stderr(&out));
    stdout(&out)
}

fn first_word(line: &str) -> &str {
    line.split_whitespace().next().unwrap()
}

/// blksum `args` reading `file` from a pipe whose writer may be left
/// with bytes blksum never reads (`--size`), as `dd ... | blksum` is.
fn run_cut_pipe(args: &[&str], file: &Path) -> std::process::Output {
    use std::process::Stdio;
    let mut child = blksum()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut f = std::fs::File::open(file).unwrap();
    let writer = std::thread::spawn(move || {
        // Broken pipe once blksum has what it asked for.
        let _ = std::io::copy(&mut f, &mut stdin);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `blksum --size N` of a device holding the image and then other bytes is
/// `blksum` of the image (N its virtual size), with any digest and block
/// size; standard input too; more than there is fails.
#[test]
fn first_bytes_of_a_block_device() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = scratch();
    let d = dir.path();
    let src = d.join("source.qcow2");
    create(&src, "qcow2", &[], "3m");
    qemu_io(
        &src,
        "qcow2",
        &["write -P 0x41 0 1M", "write -P 0x42 2M 4k"],
    );
    let dev = d.join("pvc.raw");
    qemu_img_in(d, &["convert", "-O", "raw", "source.qcow2", "pvc.raw"]);
    qemu_img_in(d, &["resize", "-q", "-f", "raw", "pvc.raw", "16m"]);
    qemu_io(&dev, "raw", &["write -P 0xee 3M 5M"]);
    for opts in [&[][..], &["-d", "blake3", "--block-size", "4k"]] {
        let mut a = opts.to_vec();
        a.push(s(&src));
        let want = sum(&a);
        let mut b = opts.to_vec();
        b.extend(["--size", "3m", s(&dev)]);
        assert_eq!(first_word(&sum(&b)), first_word(&want), "{opts:?}");
        let mut b = opts.to_vec();
        b.extend(["--size", "3145728", "-"]);
        let piped = run_cut_pipe(&b, &dev);
        assert_eq!(
            first_word(&stdout(&piped)),
            first_word(&want),
            "{opts:?}: a pipe"
        );
    }
    assert_ne!(first_word(&sum(&[s(&dev)])), first_word(&sum(&[s(&src)])));
    let out = run(&["--size", "17m", s(&dev)], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("pvc.raw") && stderr(&out).contains("17825792 bytes"));
    let out = run_pipe(&["--size", "17m", "-"], &dev);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("ended after 16777216 bytes"),
        "{}",
        stderr(&out)
    );
}

/// `blksum --chain FULL,INC1,INC2` is `blksum` of the same files rebased
/// with `qemu-img rebase -u` (and of their raw conversion), virtual sizes
/// growing and shrinking; `--check` of its line checks the chain.
#[test]
fn backups_named_as_a_chain() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = scratch();
    let d = dir.path();
    for sizes in [["4m", "4m", "4m"], ["2m", "4m", "6m"], ["6m", "4m", "3m"]] {
        let writes: [&[&str]; 3] = [
            &["write -P 0x11 0 2M"],
            &[
                "write -P 0x21 64k 64k",
                "write -z 1M 64k",
                "write -P 0x22 3M 64k",
            ],
            &["write -P 0x31 0 4k", "write -P 0x32 2M 1M"],
        ];
        let mut names = Vec::new();
        for (i, (size, cmds)) in sizes.iter().zip(writes).enumerate() {
            let name = format!("backup-{i}.qcow2");
            let p = d.join(&name);
            create(&p, "qcow2", &[], size);
            // Writes past a smaller image's end are left out.
            let fits: Vec<&str> = cmds
                .iter()
                .copied()
                .filter(|c| !(size == &"2m" && c.contains(" 3M ")))
                .collect();
            qemu_io(&p, "qcow2", &fits);
            names.push(name);
        }
        for (i, n) in names.iter().enumerate() {
            std::fs::copy(d.join(n), d.join(format!("r{i}.qcow2"))).unwrap();
        }
        qemu_img_in(
            d,
            &["rebase", "-u", "-F", "qcow2", "-b", "r0.qcow2", "r1.qcow2"],
        );
        qemu_img_in(
            d,
            &["rebase", "-u", "-F", "qcow2", "-b", "r1.qcow2", "r2.qcow2"],
        );
        qemu_img_in(d, &["convert", "-O", "raw", "r2.qcow2", "restored.raw"]);
        let chain: Vec<String> = names.iter().map(|n| s(&d.join(n)).to_string()).collect();
        let chain = chain.join(",");
        let line = sum(&["--chain", &chain]);
        assert_eq!(line, format!("{}  {chain}\n", first_word(&line)));
        let want = sum(&[s(&d.join("restored.raw"))]);
        assert_eq!(first_word(&line), first_word(&want), "{sizes:?}");
        assert_eq!(
            first_word(&sum(&[s(&d.join("r2.qcow2"))])),
            first_word(&want)
        );
        let list = d.join("SUMS");
        std::fs::write(&list, &line).unwrap();
        let ok = sum(&["--chain", "-c", s(&list)]);
        assert_eq!(ok, format!("{chain}: OK\n"));
    }
}
