//! A finished checksum.

use crate::algorithm::Algorithm;
use crate::construction::Construction;
use std::fmt;

/// The checksum of an image: the outer digest's bytes, and the algorithm
/// and [`Construction`] that made them. Displays as lowercase hex (`{}` or `{:x}`); parses back
/// from hex with [`Checksum::from_hex`] or, for the default SHA-256,
/// `str::parse`. Two checksums are equal when their constructions,
/// algorithms and bytes are, and the bytes are compared in constant time (as `blake3::Hash`
/// does), so comparing with an expected checksum leaks nothing.
///
/// ```
/// use blkhash::{Algorithm, Checksum, Hasher, Options};
/// let h = Hasher::with_options(Options::new().algorithm(Algorithm::Md5)).unwrap();
/// let c = h.finalize();
/// // The checksum of nothing is H(le64(0)).
/// assert_eq!(c.to_string(), "7dea362b3fac8e00956a4952a3d4f474");
/// assert_eq!(format!("{c:x}"), c.to_string());
/// assert_eq!(c.as_ref().len(), 16);
/// let back = Checksum::from_hex(Algorithm::Md5, "7DEA362B3FAC8E00956A4952A3D4F474").unwrap();
/// assert_eq!(back, c);
/// assert!(Checksum::from_hex(Algorithm::Md5, "7dea").is_err());
/// ```
#[derive(Clone, Debug, Eq)]
pub struct Checksum {
    construction: Construction,
    algorithm: Algorithm,
    bytes: Vec<u8>,
}

impl Checksum {
    pub(crate) fn new(algorithm: Algorithm, bytes: Vec<u8>) -> Self {
        Checksum {
            construction: Construction::Blkhash,
            algorithm,
            bytes,
        }
    }

    /// The construction that made it ([`Construction::Blkhash`] for one
    /// parsed with [`from_hex`](Checksum::from_hex) or
    /// [`from_bytes`](Checksum::from_bytes)).
    pub fn construction(&self) -> Construction {
        self.construction
    }

    /// The same bytes, said to be of construction `c` (a checksum read
    /// from a line or a file that names its construction).
    ///
    /// ```
    /// use blkhash::{Algorithm, Checksum, Construction};
    /// let c = Checksum::from_bytes(Algorithm::Sha256, &[7; 32]).unwrap();
    /// let pbs = c.clone().with_construction(Construction::Pbs);
    /// assert_eq!(pbs.construction(), Construction::Pbs);
    /// assert_ne!(c, pbs);
    /// ```
    pub fn with_construction(mut self, c: Construction) -> Checksum {
        self.construction = c;
        self
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

    /// The checksum of `algorithm` whose digest is `bytes` (as a block map
    /// stores it): exactly the digest's length, else an error saying why.
    ///
    /// ```
    /// use blkhash::{Algorithm, Checksum};
    /// let c = Checksum::from_bytes(Algorithm::Sha256, &[7; 32]).unwrap();
    /// assert_eq!(c.as_bytes(), &[7; 32]);
    /// assert!(Checksum::from_bytes(Algorithm::Sha256, &[7; 16]).is_err());
    /// ```
    pub fn from_bytes(algorithm: Algorithm, bytes: &[u8]) -> Result<Checksum, ParseChecksumError> {
        let want = algorithm.output_len();
        if bytes.len() != want {
            return Err(ParseChecksumError(format!(
                "{} bytes, not {want} as {algorithm} has",
                bytes.len()
            )));
        }
        Ok(Checksum::new(algorithm, bytes.to_vec()))
    }

    /// The checksum of `algorithm` written as `hex` (either case): exactly
    /// the digest's length in hex digits, else an error saying why.
    pub fn from_hex(algorithm: Algorithm, hex: &str) -> Result<Checksum, ParseChecksumError> {
        let want = 2 * algorithm.output_len();
        if hex.len() != want {
            return Err(ParseChecksumError(format!(
                "{} hex digits, not {want} as {algorithm} has",
                hex.len()
            )));
        }
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let bytes = hex
            .as_bytes()
            .chunks(2)
            .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| ParseChecksumError("not a hex string".into()))?;
        Ok(Checksum::new(algorithm, bytes))
    }
}

/// Why a string is not a checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseChecksumError(String);

impl fmt::Display for ParseChecksumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseChecksumError {}

impl PartialEq for Checksum {
    fn eq(&self, other: &Checksum) -> bool {
        self.algorithm == other.algorithm
            && self.construction == other.construction
            && constant_time_eq::constant_time_eq(&self.bytes, &other.bytes)
    }
}

impl std::hash::Hash for Checksum {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.construction.hash(state);
        self.algorithm.hash(state);
        self.bytes.hash(state);
    }
}

impl AsRef<[u8]> for Checksum {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// A SHA-256 checksum (the default digest) from hex; other digests need
/// [`Checksum::from_hex`], since the length alone does not name one.
impl std::str::FromStr for Checksum {
    type Err = ParseChecksumError;
    fn from_str(s: &str) -> Result<Checksum, ParseChecksumError> {
        Checksum::from_hex(Algorithm::Sha256, s)
    }
}

impl fmt::LowerHex for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
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
