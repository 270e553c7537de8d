//! A finished checksum.

use crate::algorithm::Algorithm;
use std::fmt;

/// The checksum of an image: the outer digest's bytes, and the algorithm
/// that made them. Displays as lowercase hex.
///
/// ```
/// use blkhash::{Algorithm, Hasher, Options};
/// let h = Hasher::new(Options::new().algorithm(Algorithm::Md5)).unwrap();
/// let c = h.finalize();
/// // The checksum of nothing is H(le64(0)).
/// assert_eq!(c.to_string(), "7dea362b3fac8e00956a4952a3d4f474");
/// assert_eq!(c.as_bytes().len(), 16);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Checksum {
    algorithm: Algorithm,
    bytes: Vec<u8>,
}

impl Checksum {
    pub(crate) fn new(algorithm: Algorithm, bytes: Vec<u8>) -> Self {
        Checksum { algorithm, bytes }
    }

    /// The algorithm of the outer and block digests.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The raw digest bytes (empty for `null`).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Lowercase hex, as printed.
    pub fn to_hex(&self) -> String {
        to_hex(&self.bytes)
    }
}

/// Lowercase hex of any bytes.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
