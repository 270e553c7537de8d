//! A file that another process truncates while blksum hashes it from
//! memory maps (`--cache`): a touch of a page past the new end raises
//! SIGBUS, which must end the run with exit 1 and "the file shrank while it
//! was read", never with the signal and never with a checksum.

use crate::common;

use common::progress::spawn_with_progress;
use common::*;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

const SIZE: u64 = 64 << 20;
const RUNS: usize = 100;

#[test]
fn a_file_truncated_at_random_points_of_runs_fails_every_run_with_the_message() {
    let dir = testkit::tools::scratch();
    let path = image(dir.path(), "a.img", "64m:r");
    let bytes = std::fs::read(&path).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let name = path.to_str().unwrap();
    // A slow digest, so that a run lasts long enough to be cut while its
    // workers read the maps (64 MiB of SHA3-512: about 0.2 s on 2 cores).
    let args = ["--cache", "-d", "sha3-512", "--progress=3", name];
    let whole = run(&["--cache", "-d", "sha3-512", name], None);
    assert!(whole.status.success(), "{}", stderr(&whole));
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = testkit::Rng(seed);
    let mut cut_during_runs = 0;
    let mut attempts = 0;
    while cut_during_runs < RUNS {
        attempts += 1;
        assert!(
            attempts < 3 * RUNS,
            "seed {seed}: too many runs ended before their cut"
        );
        let mut cmd = blksum();
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (mut child, mut progress) = spawn_with_progress(&mut cmd);
        // A random moment of the run (what it has passed on to its
        // workers), and a random new length: behind what was read, under
        // the workers' maps, or ahead of them.
        let at = 1 + rng.below(90) as u32;
        let cut = rng.below(SIZE / 4096) * 4096;
        let running = progress.wait_for(at) && child.try_wait().unwrap().is_none();
        if running {
            file.set_len(cut).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        if running {
            cut_during_runs += 1;
            let err = stderr(&out);
            assert_eq!(
                out.status.signal(),
                None,
                "seed {seed}, run {attempts}: killed by a signal (cut to {cut} at {at}%): {err}"
            );
            assert_eq!(
                out.status.code(),
                Some(1),
                "seed {seed}, run {attempts}: cut to {cut} at {at}%: {err}"
            );
            assert!(
                err.contains("the file shrank while it was read"),
                "seed {seed}, run {attempts}: cut to {cut} at {at}%: {err}"
            );
            assert!(
                out.stdout.is_empty(),
                "seed {seed}, run {attempts}: a checksum for a file cut to {cut}: {}",
                stdout(&out)
            );
            // Whole again for the next run.
            file.set_len(SIZE).unwrap();
            file.write_all_at(&bytes[cut as usize..], cut).unwrap();
        }
    }
}
