//! qcow2 images whose virtual size is not a multiple of 512: QEMU's guest
//! sees the size rounded down, and blkdiff agrees with `qemu-img compare`
//! on an image and its raw conversion.

use crate::common;

use common::*;
use std::os::unix::fs::FileExt;

#[test]
fn blkdiff_agrees_with_qemu_img_compare_on_unaligned_sizes() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    for size in [1u64, 511, 513, 16 * MIB + 7] {
        let img = image(
            d,
            &format!("u{size}.qcow2"),
            "qcow2",
            32 * MIB,
            &["write -P 0x5a 0 32M"],
        );
        // The virtual size field (bytes 24-31 of the header, big-endian):
        // qemu-img creates only multiples of 512.
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&size.to_be_bytes(), 24).unwrap();
        let raw = d.join(format!("u{size}.raw"));
        sh("qemu-img", &["convert", "-O", "raw", s(&img), s(&raw)]);
        assert_eq!(std::fs::metadata(&raw).unwrap().len(), size / 512 * 512);
        assert!(same(&img, &raw), "qemu-img compare: {size}");
        let out = run(BLKDIFF, &[s(&img), s(&raw)]);
        assert_eq!(
            out.code, 0,
            "blkdiff, size {size}: {}{}",
            out.stdout, out.stderr
        );
    }
}
