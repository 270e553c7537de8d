//! Detecting all-zero buffers, at memory speed.
//!
//! One scan, three kernels: AVX-512 and AVX2 chosen at run time on x86_64
//! CPUs that have them (`is_x86_feature_detected!` caches what the CPU
//! offers, so the choice costs a load and a test per call), and a portable
//! OR-fold for every other CPU. glibc's `memcmp`, the reference's zero test,
//! picks its vector width the same way; a build for the x86_64 baseline
//! alone would be limited to SSE2's 16 bytes per load.

/// True if every byte of `buf` is zero.
///
/// Non-zero data almost always fails on the first bytes, so those are tested
/// first; the rest is OR-folded several vectors at a time with one test per
/// fold, using the widest vectors the CPU has.
///
/// ```
/// assert!(blkhash::is_zero(&[0u8; 4096]));
/// let mut b = vec![0u8; 4096];
/// b[4095] = 1;
/// assert!(!blkhash::is_zero(&b));
/// assert!(blkhash::is_zero(&[]));
/// ```
pub fn is_zero(buf: &[u8]) -> bool {
    let head = buf.len().min(16);
    if buf[..head].iter().any(|&b| b != 0) {
        return false;
    }
    // The whole buffer, head included: blocks are multiples of 512 bytes,
    // so the kernels' wide loops cover them with no byte-wise tail.
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { x86::avx512(buf) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { x86::avx2(buf) };
        }
    }
    portable(buf)
}

/// The OR-fold for any CPU: 256 bytes at a time with no branch inside a
/// chunk, which the compiler turns into the widest vector ORs the target
/// allows at build time.
fn portable(buf: &[u8]) -> bool {
    const CHUNK: usize = 256;
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// AVX2: eight 32-byte loads OR-folded, one `vptest` per 256 bytes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(buf: &[u8]) -> bool {
        let mut chunks = buf.chunks_exact(256);
        for c in &mut chunks {
            let p = c.as_ptr().cast::<__m256i>();
            // SAFETY: `c` holds 256 bytes, eight unaligned 32-byte loads.
            let v = unsafe {
                let a = _mm256_or_si256(_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)));
                let b = _mm256_or_si256(_mm256_loadu_si256(p.add(2)), _mm256_loadu_si256(p.add(3)));
                let c = _mm256_or_si256(_mm256_loadu_si256(p.add(4)), _mm256_loadu_si256(p.add(5)));
                let d = _mm256_or_si256(_mm256_loadu_si256(p.add(6)), _mm256_loadu_si256(p.add(7)));
                _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d))
            };
            if _mm256_testz_si256(v, v) == 0 {
                return false;
            }
        }
        super::portable(chunks.remainder())
    }

    /// AVX-512: eight 64-byte loads OR-folded, one mask test per 512 bytes.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512(buf: &[u8]) -> bool {
        let mut chunks = buf.chunks_exact(512);
        for c in &mut chunks {
            let p = c.as_ptr().cast::<__m512i>();
            // SAFETY: `c` holds 512 bytes, eight unaligned 64-byte loads.
            let v = unsafe {
                let a = _mm512_or_si512(_mm512_loadu_si512(p), _mm512_loadu_si512(p.add(1)));
                let b = _mm512_or_si512(_mm512_loadu_si512(p.add(2)), _mm512_loadu_si512(p.add(3)));
                let c = _mm512_or_si512(_mm512_loadu_si512(p.add(4)), _mm512_loadu_si512(p.add(5)));
                let d = _mm512_or_si512(_mm512_loadu_si512(p.add(6)), _mm512_loadu_si512(p.add(7)));
                _mm512_or_si512(_mm512_or_si512(a, b), _mm512_or_si512(c, d))
            };
            if _mm512_test_epi64_mask(v, v) != 0 {
                return false;
            }
        }
        super::portable(chunks.remainder())
    }
}

/// A zero test, by name.
#[cfg(test)]
type Kernel = (&'static str, fn(&[u8]) -> bool);

/// Every kernel this CPU can run, by name: the tests check each one.
#[cfg(test)]
fn kernels() -> Vec<Kernel> {
    // mut: other architectures push nothing.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Vec<Kernel> = vec![("portable", portable)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: called only where the CPU has AVX2 (detected above).
            v.push(("avx2", |b| unsafe { x86::avx2(b) }));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: called only where the CPU has AVX-512F (detected above).
            v.push(("avx512", |b| unsafe { x86::avx512(b) }));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition every kernel is checked against.
    fn model(buf: &[u8]) -> bool {
        buf.iter().all(|&b| b == 0)
    }

    /// `is_zero` itself, then each kernel (called without the head test).
    fn every_variant() -> Vec<Kernel> {
        let mut v: Vec<Kernel> = vec![("is_zero", is_zero)];
        v.extend(kernels());
        v
    }

    #[test]
    fn the_cpus_kernels_are_all_tested() {
        let names: Vec<_> = kernels().iter().map(|k| k.0).collect();
        assert!(names.contains(&"portable"));
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(
                names.contains(&"avx2"),
                std::arch::is_x86_feature_detected!("avx2")
            );
            assert_eq!(
                names.contains(&"avx512"),
                std::arch::is_x86_feature_detected!("avx512f")
            );
        }
        eprintln!("zero-test kernels on this CPU: {names:?}");
    }

    #[test]
    fn every_position_and_length() {
        for (name, f) in every_variant() {
            for len in [
                0usize, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 511, 512, 513, 1000,
                1024, 4096, 4097,
            ] {
                let mut b = vec![0u8; len];
                assert!(f(&b), "{name} len {len}");
                for i in 0..len {
                    b[i] = 0x80;
                    assert!(!f(&b), "{name} len {len} pos {i}");
                    b[i] = 1;
                    assert!(!f(&b), "{name} len {len} pos {i}");
                    b[i] = 0;
                }
            }
        }
    }

    #[test]
    fn unaligned_slices() {
        for (name, f) in every_variant() {
            let mut b = vec![0u8; 4096 + 64];
            for start in 0..64 {
                assert!(f(&b[start..start + 4096]), "{name} start {start}");
            }
            b[4096 + 63] = 1;
            for start in 0..64 {
                assert!(!f(&b[start..4096 + 64]), "{name} start {start}");
            }
        }
    }

    proptest! {
        #[test]
        fn agrees_with_the_definition(
            len in 0usize..3000,
            start in 0usize..64,
            set in proptest::collection::vec((0usize..3064, 1u8..=255), 0..3),
        ) {
            let mut b = vec![0u8; start + len];
            for (pos, byte) in set {
                if pos < b.len() {
                    b[pos] = byte;
                }
            }
            let buf = &b[start..];
            for (name, f) in every_variant() {
                prop_assert_eq!(f(buf), model(buf), "{}", name);
            }
        }
    }
}
