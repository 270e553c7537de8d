//! PBS data blobs from untrusted bytes (`blkimage::pbs::store::blob::decode`,
//! what every chunk of a datastore and a snapshot's manifest go through):
//! the magic, the CRC, zstd (bounded by the caller's length: a bomb is
//! refused, never allocated past it), AES-256-GCM with a 16-byte IV. The
//! first byte picks the bound (1 KiB to 1 MiB) and whether a key is given
//! (`[1; 32]`); each input is also tried with its CRC made true, so that
//! random bytes reach the decoders. A blob that decodes gives at most the
//! bound, and a plain one its body. Errors are fine; panics, hangs and
//! allocations past the bound are not.

use blkimage::pbs::store::{Key, blob};

fn check_one(data: &[u8], key: Option<&Key>, max: usize) {
    if let Ok(out) = blob::decode(data, key, max) {
        assert!(out.len() <= max);
        if data.starts_with(&blob::PLAIN) {
            assert_eq!(out, data[12..]);
        }
    }
}

/// Check one input (see the module doc).
pub fn check(input: &[u8]) {
    let Some((&pick, data)) = input.split_first() else {
        return;
    };
    let key = Key::new([1; 32]);
    let key = (pick & 1 == 1).then_some(&key);
    let max = 1024 << (pick >> 1 & 0x0f).min(10);
    check_one(data, key, max);
    // The CRC made true: the decoders are reached.
    if let Some(head) = data.get(..8).and_then(blob::header_len)
        && data.len() >= head
    {
        let mut fixed = data.to_vec();
        let crc = crc32fast::hash(&fixed[head..]);
        fixed[8..12].copy_from_slice(&crc.to_le_bytes());
        check_one(&fixed, key, max);
    }
}
