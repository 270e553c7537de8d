//! Digest names: the C names a program may pass (ours and OpenSSL's
//! spellings), and the list `blkhash_digests` gives.

use construction::Algorithm;
use libc::{c_char, size_t};
use std::ffi::CStr;

/// The digest a C name stands for: our names, matched without regard to
/// case as OpenSSL does, and OpenSSL's other spellings of the same digests
/// (a program written for 0.11 may pass any name EVP_MD_fetch knows).
pub(crate) fn algorithm(name: &str) -> Option<Algorithm> {
    if let Ok(a) = name.parse() {
        return Some(a);
    }
    let alias = match name.to_ascii_lowercase().as_str() {
        "sha-1" => "sha1",
        "sha2-224" | "sha-224" => "sha224",
        "sha2-256" | "sha-256" => "sha256",
        "sha2-384" | "sha-384" => "sha384",
        "sha2-512" | "sha-512" => "sha512",
        "sha2-512/224" | "sha-512/224" | "sha512/224" => "sha512-224",
        "sha2-512/256" | "sha-512/256" | "sha512/256" => "sha512-256",
        "blake2b-512" => "blake2b512",
        "blake2s-256" => "blake2s256",
        "ripemd-160" | "ripemd" | "rmd160" => "ripemd160",
        "shake-128" => "shake128",
        "shake-256" => "shake256",
        _ => return None,
    };
    alias.parse().ok()
}
/// Our digest names as C strings, in `ALGORITHMS` order (a test checks).
static DIGEST_NAMES: [&CStr; 22] = [
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
    c"blake2b-256",
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
    fn digest_names_are_the_algorithms() {
        let ours: Vec<&str> = DIGEST_NAMES.iter().map(|c| c.to_str().unwrap()).collect();
        let theirs: Vec<&str> = ALGORITHMS.iter().map(|a| a.name()).collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn openssl_spellings() {
        assert_eq!(algorithm("SHA2-256"), Some(Algorithm::Sha256));
        assert_eq!(algorithm("SHA256"), Some(Algorithm::Sha256));
        assert_eq!(algorithm("sha-512/256"), Some(Algorithm::Sha512_256));
        assert_eq!(algorithm("BLAKE2B-512"), Some(Algorithm::Blake2b512));
        assert_eq!(algorithm("sha257"), None);
    }

    #[test]
    fn max_md_size_fits_every_digest() {
        for a in ALGORITHMS {
            assert!(a.output_len() <= BLKHASH_MAX_MD_SIZE, "{a}");
        }
    }
}
