//! Detecting all-zero buffers, fast.

/// True if every byte of `buf` is zero.
///
/// Non-zero data almost always fails on the first bytes, so those are tested
/// first; the rest is OR-folded 256 bytes at a time with no branch inside a
/// chunk, which the compiler turns into wide vector ORs.
///
/// ```
/// assert!(blkhash::is_zero(&[0u8; 4096]));
/// let mut b = vec![0u8; 4096];
/// b[4095] = 1;
/// assert!(!blkhash::is_zero(&b));
/// assert!(blkhash::is_zero(&[]));
/// ```
pub fn is_zero(buf: &[u8]) -> bool {
    const CHUNK: usize = 256;
    let head = buf.len().min(16);
    if buf[..head].iter().any(|&b| b != 0) {
        return false;
    }
    let mut chunks = buf.chunks_exact(CHUNK);
    for chunk in &mut chunks {
        let mut acc = 0u64;
        for word in chunk.chunks_exact(8) {
            acc |= u64::from_ne_bytes(word.try_into().unwrap());
        }
        if acc != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_position_and_length() {
        for len in [0usize, 1, 15, 16, 17, 255, 256, 257, 1000, 4096, 4097] {
            let mut b = vec![0u8; len];
            assert!(is_zero(&b), "len {len}");
            for i in 0..len {
                b[i] = 0x80;
                assert!(!is_zero(&b), "len {len} pos {i}");
                b[i] = 0;
            }
        }
    }

    #[test]
    fn unaligned_slices() {
        let mut b = vec![0u8; 1024 + 8];
        for start in 0..8 {
            assert!(is_zero(&b[start..start + 1024]));
        }
        b[1031] = 1;
        assert!(!is_zero(&b[7..1032]));
    }
}
