//! What blksync says, as people read it: dates, not epoch nanoseconds;
//! "1 range", not "1 ranges".

use crate::common;

use common::*;

#[test]
fn summary_and_refusal_read_as_english() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = image(d, "src.raw", "raw", MIB, &["write -P 0x11 0 1M"]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    let out = run(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains(" in 1 range, "), "{}", out.stderr);
    // A first copy: DST held nothing, so nothing was compared.
    assert!(
        out.stderr
            .contains("a first copy, 16 blocks read, none compared"),
        "{}",
        out.stderr
    );
    // The next run compares every block with the state.
    let out = run(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("; 16 blocks compared, "),
        "{}",
        out.stderr
    );

    // DST touched behind the state: the times are dates.
    sh("touch", &["-d", "2030-01-02 03:04:05", s(&dst)]);
    let out = run(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("modification time is 2030-01-02T03:04:05"),
        "{}",
        out.stderr
    );
}
