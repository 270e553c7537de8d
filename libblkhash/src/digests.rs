//! Digest names: the C names a program may pass (ours and OpenSSL's
//! spellings), and the list `blkhash_digests` gives.

use construction::Algorithm;
use libc::{c_char, size_t};
use std::ffi::CStr;

/// The digest a C name stands for: any name blksum's `--digest` and
/// Python's `blkhash.new()` take (ours, hashlib's and OpenSSL's other
/// spellings, matched without regard to case as OpenSSL does: a program
/// written for 0.11 may pass any name EVP_MD_fetch knows).
pub(crate) fn algorithm(name: &str) -> Option<Algorithm> {
    name.parse().ok()
}

/// The names `blkhash_digests` gives, as C strings: those blksum
/// `--list-digests` prints ([`Algorithm::listed`]), in its order (a test
/// checks).
static DIGEST_NAMES: [&CStr; 21] = [
    c"md5",
    c"sha1",
    c"sha224",
    c"sha256",
    c"sha384",
    c"sha512",
    c"sha512-224",
    c"sha512-256",
    c"sha3-224",
    c"sha3-256",
    c"sha3-384",
    c"sha3-512",
    c"blake2b512",
    c"blake2s256",
    c"sm3",
    c"ripemd160",
    c"md5-sha1",
    c"shake128",
    c"shake256",
    c"blake3",
    c"null",
];
/// Fill `names` with up to `count` digest names (static strings) and return
/// how many were written; with NULL `names` or a zero `count`, return how
/// many there are.
///
/// # Safety
///
/// `names` is NULL or has room for `count` pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_digests(names: *mut *const c_char, count: size_t) -> size_t {
    if names.is_null() || count == 0 {
        return DIGEST_NAMES.len();
    }
    let n = count.min(DIGEST_NAMES.len());
    for (i, name) in DIGEST_NAMES.iter().take(n).enumerate() {
        // SAFETY: i < count, and the caller gave room for count pointers.
        unsafe { *names.add(i) = name.as_ptr() };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BLKHASH_MAX_MD_SIZE;
    use construction::ALGORITHMS;

    #[test]
    fn digest_names_are_the_listed_algorithms() {
        let ours: Vec<&str> = DIGEST_NAMES.iter().map(|c| c.to_str().unwrap()).collect();
        let theirs: Vec<&str> = Algorithm::listed().map(|a| a.name()).collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn openssl_and_hashlib_spellings() {
        assert_eq!(algorithm("SHA2-256"), Some(Algorithm::Sha256));
        assert_eq!(algorithm("SHA256"), Some(Algorithm::Sha256));
        assert_eq!(algorithm("sha-512/256"), Some(Algorithm::Sha512_256));
        assert_eq!(algorithm("BLAKE2B-512"), Some(Algorithm::Blake2b512));
        assert_eq!(algorithm("shake_128"), Some(Algorithm::Shake128));
        assert_eq!(algorithm("sha3_256"), Some(Algorithm::Sha3_256));
        // Not listed, still taken.
        assert_eq!(algorithm("blake2b-256"), Some(Algorithm::Blake2b256));
        assert_eq!(algorithm("sha257"), None);
    }

    #[test]
    fn max_md_size_fits_every_digest() {
        for a in ALGORITHMS {
            assert!(a.output_len() <= BLKHASH_MAX_MD_SIZE, "{a}");
        }
    }
}
