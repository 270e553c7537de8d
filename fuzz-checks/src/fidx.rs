//! Proxmox Backup Server fixed indexes from untrusted bytes
//! (`blkmap::FidxReader`, what `blkmap checksum X.fidx`, `blkdiff` and
//! wherever a map is read take): the header checked, the digests streamed
//! in bounded batches, the end and `index_csum` checked. An index that
//! reads through must give exactly `ceil(size / chunk_size)` digests, in
//! batches of whole digests, and a map of that many blocks whose checksum
//! is the reader's. Errors are fine; panics, hangs and allocations sized
//! by the header's claims are not.
//!
//! Random bytes rarely carry a true `index_csum` or a 4096-byte header
//! with a sane chunk size, so each input is also tried repaired: its first
//! bytes as the chunk size's exponent and a small size, the header padded
//! to 4096 bytes, and `index_csum` replaced by the digest of the digests.

use blkhash::Algorithm;
use blkmap::{FIDX_HEADER_LEN, FIDX_MAGIC, FidxHeader, FidxReader, fidx_map};

fn check_one(bytes: &[u8]) {
    let Ok(mut r) = FidxReader::new(bytes) else {
        return;
    };
    let header: FidxHeader = r.header().clone();
    assert!(header.chunk_size.is_power_of_two());
    assert!((512..=64 << 20).contains(&header.chunk_size));
    let mut digests = 0u64;
    loop {
        match r.next_digests() {
            Ok(Some(d)) => {
                assert!(!d.is_empty() && d.len() % 32 == 0 && d.len() <= 1 << 20);
                digests += d.len() as u64 / 32;
            }
            Ok(None) => break,
            Err(_) => return,
        }
    }
    // Read through: every digest, the file's end, index_csum all true.
    assert_eq!(digests, header.chunks());
    assert_eq!(bytes.len() as u64, header.file_len());
    let sum = r.checksum().expect("a checked index has a checksum");
    let map = fidx_map(FidxReader::new(bytes).unwrap()).expect("a checked index is a map");
    assert_eq!(map.blocks(), header.chunks());
    assert_eq!(map.checksum(), &sum);
    assert_eq!(map.derive_checksum(), sum);
    // The same map written to a file and read where it lies (blksync's
    // state of an index).
    let out = tempfile::tempfile().expect("a temporary file");
    let file = blkmap::fidx_map_file(FidxReader::new(bytes).unwrap(), out)
        .expect("a checked index is a map file");
    assert_eq!(blkmap::MapLike::header(&file).checksum.as_ref(), Some(&sum));
    // The first blocks and the last: a block read costs a read of the file.
    let last = map.blocks().checked_sub(1);
    for i in (0..map.blocks().min(64)).chain(last) {
        let want = match map.block(i) {
            Some(blkmap::Block::Data(d)) => Some(d.to_vec()),
            _ => None,
        };
        assert_eq!(file.block(i).unwrap(), want, "block {i}");
    }
}

/// The target's check of one input.
pub fn check(data: &[u8]) {
    check_one(data);
    // Repaired: magic, chunk size 2^(9..=26) from the first byte, a size
    // from the next two (at most 64 Ki chunks), the rest after the header
    // as digests, index_csum true.
    let (&shift, rest) = data.split_first().unwrap_or((&0, &[]));
    let (size_bytes, rest) = rest.split_at(rest.len().min(2));
    let chunk = 1u64 << (9 + shift % 18);
    let mut n = [0u8; 2];
    n[..size_bytes.len()].copy_from_slice(size_bytes);
    let size = u64::from(u16::from_le_bytes(n)) * chunk / 3;
    let mut f = vec![0u8; FIDX_HEADER_LEN];
    f[..8].copy_from_slice(&FIDX_MAGIC);
    f[64..72].copy_from_slice(&size.to_le_bytes());
    f[72..80].copy_from_slice(&chunk.to_le_bytes());
    f.extend_from_slice(rest);
    let mut csum = [0u8; 32];
    Algorithm::Sha256.digest_into(&f[FIDX_HEADER_LEN..], &mut csum);
    f[32..64].copy_from_slice(&csum);
    check_one(&f);
}

#[cfg(test)]
mod tests {
    /// The valid seeds read through (so `check` reaches its assertions).
    #[test]
    fn valid_seeds_read_through() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/fidx");
        for name in ["valid-4k", "valid-empty", "valid-zeros-64k"] {
            let bytes = std::fs::read(seeds.join(name)).unwrap();
            let mut r = blkmap::FidxReader::new(&bytes[..]).unwrap();
            r.checksum().unwrap_or_else(|e| panic!("{name}: {e}"));
            super::check(&bytes);
        }
    }
}
