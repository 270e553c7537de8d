//! How block digests become one checksum: blkhash 0.11's construction, or
//! the ones oVirt imageio and Proxmox Backup Server already keep.

use crate::algorithm::Algorithm;
use std::fmt;
use std::str::FromStr;

/// How the block digests are combined into the checksum.
///
/// Every construction cuts the bytes into blocks (the last one possibly
/// shorter) and digests each; a full block of zeros has a constant digest
/// (the digest of `B` zero bytes), so zero ranges are never read or
/// digested whatever the construction. They differ only in the end of the
/// outer digest:
///
/// - [`Blkhash`](Construction::Blkhash), blkhash 0.11's:
///   `H(H(block 0) || ... || H(block n-1) || le64(length))`.
/// - [`Imageio`](Construction::Imageio), oVirt imageio's checksum API
///   (`GET /images/TICKET/checksum`): `H(H(block 0) || ... || H(block n-1))`,
///   no length. Its defaults are imageio's: BLAKE2b with a 32-byte output,
///   4 MiB blocks.
/// - [`Pbs`](Construction::Pbs), the `index_csum` of a Proxmox Backup
///   Server fixed index (`.fidx`): computed as imageio's, with PBS's
///   defaults: SHA-256 (an unencrypted chunk's digest), 4 MiB chunks.
///
/// ```
/// use blkhash::{checksum_with, Algorithm, Construction};
/// let c: Construction = "imageio".parse().unwrap();
/// assert_eq!(c.default_algorithm(), Algorithm::Blake2b256);
/// assert_eq!(c.default_block_size(), 4 << 20);
/// // imageio's checksum of "abc": the digest of the one block's digest.
/// let mut d = [0u8; 32];
/// Algorithm::Blake2b256.digest_into(b"abc", &mut d);
/// let mut outer = [0u8; 32];
/// Algorithm::Blake2b256.digest_into(&d, &mut outer);
/// let sum = checksum_with(c, Algorithm::Blake2b256, 4 << 20, b"abc");
/// assert_eq!(sum.as_bytes(), outer);
/// assert_eq!(sum.construction(), Construction::Imageio);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Construction {
    /// blkhash 0.11's: the outer digest ends with the length (the default).
    #[default]
    Blkhash,
    /// oVirt imageio's: no length; BLAKE2b-256 and 4 MiB by default.
    Imageio,
    /// Proxmox Backup Server's `index_csum`: imageio's, with SHA-256 and
    /// 4 MiB by default.
    Pbs,
}

/// Every construction, in the order `--help` lists them.
pub const CONSTRUCTIONS: &[Construction] = &[
    Construction::Blkhash,
    Construction::Imageio,
    Construction::Pbs,
];

/// The error for a construction name we do not know (the name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownConstruction(pub String);

impl fmt::Display for UnknownConstruction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown construction '{}': one of blkhash, imageio, pbs",
            self.0
        )
    }
}

impl std::error::Error for UnknownConstruction {}

impl Construction {
    /// Its name: `blkhash`, `imageio` or `pbs`.
    pub fn name(self) -> &'static str {
        match self {
            Construction::Blkhash => "blkhash",
            Construction::Imageio => "imageio",
            Construction::Pbs => "pbs",
        }
    }

    /// True if the outer digest ends with the length (blkhash 0.11's).
    pub fn appends_length(self) -> bool {
        self == Construction::Blkhash
    }

    /// The digest when none is asked for.
    pub fn default_algorithm(self) -> Algorithm {
        match self {
            Construction::Blkhash | Construction::Pbs => Algorithm::Sha256,
            Construction::Imageio => Algorithm::Blake2b256,
        }
    }

    /// Whether the construction takes digest `a`: imageio's only the digests
    /// oVirt imageio computes ([`Algorithm::imageio_name`]), as its checksum
    /// would be one imageio never gives (and `null`, which computes
    /// nothing, for measuring reads); the others take every digest.
    ///
    /// ```
    /// use blkhash::{Algorithm, Construction};
    /// assert!(Construction::Imageio.takes(Algorithm::Sha3_256));
    /// assert!(!Construction::Imageio.takes(Algorithm::Md5Sha1));
    /// assert!(Construction::Blkhash.takes(Algorithm::Md5Sha1));
    /// ```
    pub fn takes(self, a: Algorithm) -> bool {
        match self {
            Construction::Imageio => a.imageio_name().is_some() || a == Algorithm::Null,
            Construction::Blkhash | Construction::Pbs => true,
        }
    }

    /// The block size when none is asked for.
    pub fn default_block_size(self) -> usize {
        match self {
            Construction::Blkhash => crate::DEFAULT_BLOCK_SIZE,
            Construction::Imageio | Construction::Pbs => 4 << 20,
        }
    }
}

impl fmt::Display for Construction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Construction {
    type Err = UnknownConstruction;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CONSTRUCTIONS
            .iter()
            .copied()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownConstruction(s.to_string()))
    }
}
