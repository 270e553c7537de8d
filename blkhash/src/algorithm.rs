//! The digest registry: every digest blkhash knows, by its OpenSSL name.
//!
//! Block digests are computed one shot (no allocation per block); the outer
//! digest is a boxed streaming state fed in large batches.

use digest::{Digest, ExtendableOutput, Update};
use std::fmt;
use std::str::FromStr;

/// A digest algorithm, named as OpenSSL names it (`openssl list -digest-algorithms`).
///
/// ```
/// use blkhash::Algorithm;
/// let alg: Algorithm = "sha256".parse().unwrap();
/// assert_eq!(alg, Algorithm::Sha256);
/// assert_eq!(alg.output_len(), 32);
/// assert_eq!(Algorithm::Blake3.name(), "blake3");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// MD5.
    Md5,
    /// SHA-1.
    Sha1,
    /// SHA-224.
    Sha224,
    /// SHA-256 (the default).
    #[default]
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
    /// SHA-512/224.
    Sha512_224,
    /// SHA-512/256.
    Sha512_256,
    /// SHA3-224.
    Sha3_224,
    /// SHA3-256.
    Sha3_256,
    /// SHA3-384.
    Sha3_384,
    /// SHA3-512.
    Sha3_512,
    /// BLAKE2b-512.
    Blake2b512,
    /// BLAKE2b with a 32-byte output (Python's `hashlib.blake2b(digest_size=32)`,
    /// oVirt imageio's default): a digest of its own, not BLAKE2b-512 cut short.
    Blake2b256,
    /// BLAKE2s-256.
    Blake2s256,
    /// SM3.
    Sm3,
    /// RIPEMD-160.
    Ripemd160,
    /// MD5 and SHA-1 concatenated (OpenSSL's md5-sha1).
    Md5Sha1,
    /// SHAKE128 (16 bytes, as OpenSSL gives it).
    Shake128,
    /// SHAKE256 (32 bytes, as OpenSSL gives it).
    Shake256,
    /// BLAKE3 (32 bytes).
    Blake3,
    /// Computes nothing and gives an empty checksum: for measuring I/O.
    Null,
}

/// Every algorithm, in the order `blksum --list-digests` prints them (those
/// it names: [`Algorithm::listed`]).
pub const ALGORITHMS: &[Algorithm] = &[
    Algorithm::Md5,
    Algorithm::Sha1,
    Algorithm::Sha224,
    Algorithm::Sha256,
    Algorithm::Sha384,
    Algorithm::Sha512,
    Algorithm::Sha512_224,
    Algorithm::Sha512_256,
    Algorithm::Sha3_224,
    Algorithm::Sha3_256,
    Algorithm::Sha3_384,
    Algorithm::Sha3_512,
    Algorithm::Blake2b512,
    Algorithm::Blake2b256,
    Algorithm::Blake2s256,
    Algorithm::Sm3,
    Algorithm::Ripemd160,
    Algorithm::Md5Sha1,
    Algorithm::Shake128,
    Algorithm::Shake256,
    Algorithm::Blake3,
    Algorithm::Null,
];

/// Output lengths of the XOFs: OpenSSL's defaults, which the reference uses.
const SHAKE128_LEN: usize = 16;
const SHAKE256_LEN: usize = 32;

/// The error for a digest name we do not know (the name). Its message
/// names no way to list the known ones: the program says its own (a
/// command's option, [`ALGORITHMS`] for a library).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown digest '{}'", self.0)
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl Algorithm {
    /// The OpenSSL name.
    pub fn name(self) -> &'static str {
        use Algorithm::*;
        match self {
            Md5 => "md5",
            Sha1 => "sha1",
            Sha224 => "sha224",
            Sha256 => "sha256",
            Sha384 => "sha384",
            Sha512 => "sha512",
            Sha512_224 => "sha512-224",
            Sha512_256 => "sha512-256",
            Sha3_224 => "sha3-224",
            Sha3_256 => "sha3-256",
            Sha3_384 => "sha3-384",
            Sha3_512 => "sha3-512",
            Blake2b512 => "blake2b512",
            Blake2b256 => "blake2b-256",
            Blake2s256 => "blake2s256",
            Sm3 => "sm3",
            Ripemd160 => "ripemd160",
            Md5Sha1 => "md5-sha1",
            Shake128 => "shake128",
            Shake256 => "shake256",
            Blake3 => "blake3",
            Null => "null",
        }
    }

    /// Length of one digest in bytes (0 for `null`).
    pub fn output_len(self) -> usize {
        use Algorithm::*;
        match self {
            Md5 => 16,
            Sha1 | Ripemd160 => 20,
            Sha224 | Sha512_224 | Sha3_224 => 28,
            Sha256 | Sha512_256 | Sha3_256 | Blake2b256 | Blake2s256 | Sm3 | Blake3 => 32,
            Sha384 | Sha3_384 => 48,
            Sha512 | Sha3_512 | Blake2b512 => 64,
            Md5Sha1 => 36,
            Shake128 => SHAKE128_LEN,
            Shake256 => SHAKE256_LEN,
            Null => 0,
        }
    }

    /// Digest `data` in one shot into `out` (`out.len() == self.output_len()`).
    pub fn digest_into(self, data: &[u8], out: &mut [u8]) {
        fn fixed<D: Digest>(data: &[u8], out: &mut [u8]) {
            out.copy_from_slice(&D::digest(data));
        }
        use Algorithm::*;
        match self {
            Md5 => fixed::<md5::Md5>(data, out),
            Sha1 => fixed::<sha1::Sha1>(data, out),
            Sha224 => fixed::<sha2::Sha224>(data, out),
            Sha256 => fixed::<sha2::Sha256>(data, out),
            Sha384 => fixed::<sha2::Sha384>(data, out),
            Sha512 => fixed::<sha2::Sha512>(data, out),
            Sha512_224 => fixed::<sha2::Sha512_224>(data, out),
            Sha512_256 => fixed::<sha2::Sha512_256>(data, out),
            Sha3_224 => fixed::<sha3::Sha3_224>(data, out),
            Sha3_256 => fixed::<sha3::Sha3_256>(data, out),
            Sha3_384 => fixed::<sha3::Sha3_384>(data, out),
            Sha3_512 => fixed::<sha3::Sha3_512>(data, out),
            Blake2b512 => fixed::<blake2::Blake2b512>(data, out),
            Blake2b256 => fixed::<blake2::Blake2b256>(data, out),
            Blake2s256 => fixed::<blake2::Blake2s256>(data, out),
            Sm3 => fixed::<sm3::Sm3>(data, out),
            Ripemd160 => fixed::<ripemd::Ripemd160>(data, out),
            Md5Sha1 => {
                fixed::<md5::Md5>(data, &mut out[..16]);
                fixed::<sha1::Sha1>(data, &mut out[16..]);
            }
            Shake128 => shake::Shake128::digest_xof(data, out),
            Shake256 => shake::Shake256::digest_xof(data, out),
            Blake3 => out.copy_from_slice(blake3::hash(data).as_bytes()),
            Null => {}
        }
    }

    /// Digest several independent messages, writing `msgs.len()` digests of
    /// `self.output_len()` bytes each, in order, into `out`.
    ///
    /// SHA-256 hashes them several at a time on one core (`tape-sha256`'s
    /// multi-buffer kernels: interleaved SHA-NI streams here). One SHA-256
    /// is a serial chain of rounds that leaves the SHA unit waiting on its
    /// own latency; independent blocks fill those gaps, ~1.6x per core on
    /// this machine. The other digests are done one message at a time.
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// let msgs: [&[u8]; 3] = [b"a", b"bc", &[7u8; 4096]];
    /// let mut many = vec![0u8; 3 * 32];
    /// Algorithm::Sha256.digest_many(&msgs, &mut many);
    /// for (m, d) in msgs.iter().zip(many.chunks(32)) {
    ///     let mut one = [0u8; 32];
    ///     Algorithm::Sha256.digest_into(m, &mut one);
    ///     assert_eq!(d, one);
    /// }
    /// ```
    pub fn digest_many(self, msgs: &[&[u8]], out: &mut [u8]) {
        self.digest_many_keyed(msgs, &[], out);
    }

    /// [`digest_many`](Algorithm::digest_many) of each message followed by
    /// `key`: `H(msg || key)`, a keyed block digest (Proxmox Backup
    /// Server's encrypted chunks are digested so, with a key of 32 bytes).
    /// SHA-256 keeps its multi-buffer kernels: the key is a tail each
    /// stream reads after its message, never copied beside it.
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// let msgs: [&[u8]; 2] = [b"a", &[7u8; 4096]];
    /// let mut many = vec![0u8; 2 * 32];
    /// Algorithm::Sha256.digest_many_keyed(&msgs, b"key", &mut many);
    /// let mut one = [0u8; 32];
    /// Algorithm::Sha256.digest_keyed_into(&[7u8; 4096], b"key", &mut one);
    /// assert_eq!(&many[32..], one);
    /// Algorithm::Sha256.digest_into(b"akey", &mut one);
    /// assert_eq!(&many[..32], one);
    /// ```
    pub fn digest_many_keyed(self, msgs: &[&[u8]], key: &[u8], out: &mut [u8]) {
        let n = self.output_len();
        assert_eq!(out.len(), msgs.len() * n, "digest_many: output length");
        if self == Algorithm::Sha256 && msgs.len() > 1 {
            // Batches of at most 16 keep the temporaries on the stack.
            let mut tmp = [[0u8; 32]; 16];
            let mut framed = [tape_sha256::Message::new(&[]); 16];
            for (m, o) in msgs.chunks(16).zip(out.chunks_mut(16 * 32)) {
                let t = &mut tmp[..m.len()];
                if key.is_empty() {
                    tape_sha256::hash_many(m, t);
                } else {
                    let f = &mut framed[..m.len()];
                    for (f, body) in f.iter_mut().zip(m) {
                        *f = tape_sha256::Message::pair(&[], body, key);
                    }
                    tape_sha256::hash_messages(f, t);
                }
                for (d, o) in t.iter().zip(o.chunks_exact_mut(32)) {
                    o.copy_from_slice(d);
                }
            }
            return;
        }
        for (m, o) in msgs.iter().zip(out.chunks_exact_mut(n.max(1))) {
            self.digest_keyed_into(m, key, &mut o[..n]);
        }
    }

    /// The digest of `data` followed by `key` (`H(data || key)`) into
    /// `out`: [`digest_into`](Algorithm::digest_into) when `key` is empty.
    pub fn digest_keyed_into(self, data: &[u8], key: &[u8], out: &mut [u8]) {
        if key.is_empty() {
            return self.digest_into(data, out);
        }
        let mut s = self.streaming();
        s.update(data);
        s.update(key);
        out.copy_from_slice(&s.finalize());
    }

    /// A streaming state for this algorithm.
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// let mut s = Algorithm::Sha1.streaming();
    /// s.update(b"a");
    /// s.update(b"bc");
    /// let mut one = [0u8; 20];
    /// Algorithm::Sha1.digest_into(b"abc", &mut one);
    /// assert_eq!(s.finalize(), one.to_vec());
    /// ```
    pub fn streaming(self) -> Box<dyn Streaming> {
        use Algorithm::*;
        match self {
            Md5 => Box::new(Fixed(md5::Md5::new())),
            Sha1 => Box::new(Fixed(sha1::Sha1::new())),
            Sha224 => Box::new(Fixed(sha2::Sha224::new())),
            Sha256 => Box::new(Fixed(sha2::Sha256::new())),
            Sha384 => Box::new(Fixed(sha2::Sha384::new())),
            Sha512 => Box::new(Fixed(sha2::Sha512::new())),
            Sha512_224 => Box::new(Fixed(sha2::Sha512_224::new())),
            Sha512_256 => Box::new(Fixed(sha2::Sha512_256::new())),
            Sha3_224 => Box::new(Fixed(sha3::Sha3_224::new())),
            Sha3_256 => Box::new(Fixed(sha3::Sha3_256::new())),
            Sha3_384 => Box::new(Fixed(sha3::Sha3_384::new())),
            Sha3_512 => Box::new(Fixed(sha3::Sha3_512::new())),
            Blake2b512 => Box::new(Fixed(blake2::Blake2b512::new())),
            Blake2b256 => Box::new(Fixed(blake2::Blake2b256::new())),
            Blake2s256 => Box::new(Fixed(blake2::Blake2s256::new())),
            Sm3 => Box::new(Fixed(sm3::Sm3::new())),
            Ripemd160 => Box::new(Fixed(ripemd::Ripemd160::new())),
            Md5Sha1 => Box::new(Md5Sha1State(md5::Md5::new(), sha1::Sha1::new())),
            Shake128 => Box::new(Xof(shake::Shake128::default(), SHAKE128_LEN)),
            Shake256 => Box::new(Xof(shake::Shake256::default(), SHAKE256_LEN)),
            Blake3 => Box::new(Blake3State(blake3::Hasher::new())),
            Null => Box::new(NullState),
        }
    }
}

impl Algorithm {
    /// The digest of `len` zero bytes (a zero block's, the constant a map
    /// and the construction use), hashed from a small static block of
    /// zeros: a buffer of a block's size, allocated as it cannot fail
    /// cleanly, aborted runs under a memory limit (blkmap of a qcow2 image,
    /// `ulimit -v 12000`: "memory allocation of 65536 bytes failed").
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// let mut want = [0u8; 32];
    /// Algorithm::Sha256.digest_into(&vec![0u8; 100_000], &mut want);
    /// assert_eq!(Algorithm::Sha256.digest_zeros(100_000), want);
    /// ```
    pub fn digest_zeros(self, len: usize) -> Vec<u8> {
        self.digest_zeros_keyed(len, &[])
    }

    /// The digest of `len` zero bytes followed by `key`: a zero block's
    /// keyed digest ([`digest_many_keyed`](Algorithm::digest_many_keyed)).
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// let mut want = [0u8; 32];
    /// Algorithm::Sha256.digest_keyed_into(&[0u8; 5000], b"k", &mut want);
    /// assert_eq!(Algorithm::Sha256.digest_zeros_keyed(5000, b"k"), want);
    /// ```
    pub fn digest_zeros_keyed(self, len: usize, key: &[u8]) -> Vec<u8> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let mut s = self.streaming();
        let mut left = len;
        while left > 0 {
            let n = left.min(ZEROS.len());
            s.update(&ZEROS[..n]);
            left -= n;
        }
        s.update(key);
        s.finalize()
    }
}

impl Algorithm {
    /// Whether `blksum --list-digests` (and the C library's
    /// `blkhash_digests`, Python's `algorithms_available`) names it: every
    /// digest whose name Python's `hashlib.new()` takes for the same digest
    /// (libblkhash 0.11's contract: its names are OpenSSL's), and `blake3`
    /// and `null`. BLAKE2b-256 is not listed: no such name means it there
    /// (hashlib's `blake2b` is BLAKE2b-512), so `blake2b-256` is only taken.
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// assert!(Algorithm::Sha3_256.is_listed());
    /// assert!(!Algorithm::Blake2b256.is_listed());
    /// assert_eq!("blake2b-256".parse(), Ok(Algorithm::Blake2b256));
    /// ```
    pub fn is_listed(self) -> bool {
        self != Algorithm::Blake2b256
    }

    /// The digests [`Algorithm::is_listed`] names, in [`ALGORITHMS`] order.
    ///
    /// ```
    /// let names: Vec<&str> = blkhash::Algorithm::listed().map(|a| a.name()).collect();
    /// assert_eq!(names.first(), Some(&"md5"));
    /// assert!(!names.contains(&"blake2b-256"));
    /// ```
    pub fn listed() -> impl Iterator<Item = Algorithm> {
        ALGORITHMS.iter().copied().filter(|a| a.is_listed())
    }

    /// Its name in oVirt imageio's checksum API (Python's `hashlib` names,
    /// `blake2b` and `blake2s` with imageio's 32-byte output), if imageio
    /// computes it. imageio lists every name of
    /// `hashlib.algorithms_available` but makes its hasher with
    /// `getattr(hashlib, NAME)`, which fails for `md5-sha1`, `ripemd160`,
    /// `sm3`, `sha512_224` and `sha512_256` (no function of their own),
    /// and its SHAKE hashers need an output length it does not give: it
    /// computes none of those.
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// assert_eq!(Algorithm::Blake2b256.imageio_name(), Some("blake2b"));
    /// assert_eq!(Algorithm::Sha3_256.imageio_name(), Some("sha3_256"));
    /// assert_eq!(Algorithm::Blake3.imageio_name(), None);
    /// assert_eq!(Algorithm::Md5Sha1.imageio_name(), None);
    /// assert_eq!("sha512_224".parse(), Ok(Algorithm::Sha512_224));
    /// ```
    pub fn imageio_name(self) -> Option<&'static str> {
        IMAGEIO_NAMES
            .iter()
            .find(|(_, a)| *a == self)
            .map(|(n, _)| *n)
    }
}

/// imageio's names of the digests it computes (see
/// [`Algorithm::imageio_name`]), and ours for them.
const IMAGEIO_NAMES: &[(&str, Algorithm)] = &[
    ("blake2b", Algorithm::Blake2b256),
    ("blake2s", Algorithm::Blake2s256),
    ("md5", Algorithm::Md5),
    ("sha1", Algorithm::Sha1),
    ("sha224", Algorithm::Sha224),
    ("sha256", Algorithm::Sha256),
    ("sha384", Algorithm::Sha384),
    ("sha3_224", Algorithm::Sha3_224),
    ("sha3_256", Algorithm::Sha3_256),
    ("sha3_384", Algorithm::Sha3_384),
    ("sha3_512", Algorithm::Sha3_512),
    ("sha512", Algorithm::Sha512),
];

/// Other names of our digests, taken as input but never printed: Python's
/// `hashlib` names (`hashlib.algorithms_available`, as imageio names its
/// digests too; imageio's `blake2b` and `blake2s` are in
/// [`IMAGEIO_NAMES`]), and OpenSSL's other spellings of the same digests
/// (a C program written for libblkhash 0.11 may pass any name
/// `EVP_MD_fetch` knows). None names another digest of ours.
const ALIASES: &[(&str, Algorithm)] = &[
    ("sha512_224", Algorithm::Sha512_224),
    ("sha512_256", Algorithm::Sha512_256),
    ("shake_128", Algorithm::Shake128),
    ("shake_256", Algorithm::Shake256),
    ("sha-1", Algorithm::Sha1),
    ("sha2-224", Algorithm::Sha224),
    ("sha-224", Algorithm::Sha224),
    ("sha2-256", Algorithm::Sha256),
    ("sha-256", Algorithm::Sha256),
    ("sha2-384", Algorithm::Sha384),
    ("sha-384", Algorithm::Sha384),
    ("sha2-512", Algorithm::Sha512),
    ("sha-512", Algorithm::Sha512),
    ("sha2-512/224", Algorithm::Sha512_224),
    ("sha-512/224", Algorithm::Sha512_224),
    ("sha512/224", Algorithm::Sha512_224),
    ("sha2-512/256", Algorithm::Sha512_256),
    ("sha-512/256", Algorithm::Sha512_256),
    ("sha512/256", Algorithm::Sha512_256),
    ("blake2b-512", Algorithm::Blake2b512),
    ("blake2s-256", Algorithm::Blake2s256),
    ("ripemd-160", Algorithm::Ripemd160),
    ("ripemd", Algorithm::Ripemd160),
    ("rmd160", Algorithm::Ripemd160),
    ("shake-128", Algorithm::Shake128),
    ("shake-256", Algorithm::Shake256),
];

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    /// Names are matched without regard to case, as OpenSSL does; oVirt
    /// imageio's names ([`Algorithm::imageio_name`]), Python's `hashlib`
    /// names and OpenSSL's other spellings are taken too.
    ///
    /// ```
    /// use blkhash::Algorithm;
    /// assert_eq!("shake_128".parse(), Ok(Algorithm::Shake128));
    /// assert_eq!("SHA2-512/256".parse(), Ok(Algorithm::Sha512_256));
    /// assert_eq!("blake2b".parse(), Ok(Algorithm::Blake2b256));
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let alias = |names: &[(&str, Algorithm)]| {
            names
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(s))
                .map(|(_, a)| *a)
        };
        ALGORITHMS
            .iter()
            .copied()
            .find(|a| a.name().eq_ignore_ascii_case(s))
            .or_else(|| alias(IMAGEIO_NAMES))
            .or_else(|| alias(ALIASES))
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// A digest being computed incrementally.
pub trait Streaming: Send {
    /// Add bytes.
    fn update(&mut self, data: &[u8]);
    /// The digest of everything added.
    fn finalize(self: Box<Self>) -> Vec<u8>;
}

struct Fixed<D>(D);

impl<D: Digest + Send> Streaming for Fixed<D> {
    fn update(&mut self, data: &[u8]) {
        Digest::update(&mut self.0, data);
    }
    fn finalize(self: Box<Self>) -> Vec<u8> {
        self.0.finalize().to_vec()
    }
}

/// OpenSSL's md5-sha1: the MD5 digest followed by the SHA-1 digest.
struct Md5Sha1State(md5::Md5, sha1::Sha1);

impl Streaming for Md5Sha1State {
    fn update(&mut self, data: &[u8]) {
        Digest::update(&mut self.0, data);
        Digest::update(&mut self.1, data);
    }
    fn finalize(self: Box<Self>) -> Vec<u8> {
        let mut out = self.0.finalize().to_vec();
        out.extend_from_slice(&self.1.finalize());
        out
    }
}

struct Xof<X>(X, usize);

impl<X: ExtendableOutput + Update + Send> Streaming for Xof<X> {
    fn update(&mut self, data: &[u8]) {
        Update::update(&mut self.0, data);
    }
    fn finalize(self: Box<Self>) -> Vec<u8> {
        let mut out = vec![0; self.1];
        self.0.finalize_xof_into(&mut out);
        out
    }
}

struct Blake3State(blake3::Hasher);

impl Streaming for Blake3State {
    fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    fn finalize(self: Box<Self>) -> Vec<u8> {
        self.0.finalize().as_bytes().to_vec()
    }
}

struct NullState;

impl Streaming for NullState {
    fn update(&mut self, _data: &[u8]) {}
    fn finalize(self: Box<Self>) -> Vec<u8> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_digest_as_a_buffer_of_zeros() {
        for &alg in ALGORITHMS {
            for len in [0, 1, 65535, 65536, 65537, 200_000] {
                let mut want = vec![0u8; alg.output_len()];
                alg.digest_into(&vec![0u8; len], &mut want);
                assert_eq!(alg.digest_zeros(len), want, "{alg} {len}");
            }
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn names_round_trip() {
        for &a in ALGORITHMS {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
            assert_eq!(a.name().to_uppercase().parse::<Algorithm>().unwrap(), a);
        }
        assert!("sha257".parse::<Algorithm>().is_err());
        for (name, a) in IMAGEIO_NAMES {
            assert_eq!(name.parse::<Algorithm>().unwrap(), *a);
            assert_eq!(a.imageio_name(), Some(*name));
        }
        // An alias never shadows a name, nor names two digests.
        for (name, a) in ALIASES.iter().chain(IMAGEIO_NAMES) {
            assert_eq!(name.parse::<Algorithm>().unwrap(), *a, "{name}");
            assert_eq!(name.to_uppercase().parse::<Algorithm>().unwrap(), *a);
            let same = ALIASES.iter().chain(IMAGEIO_NAMES);
            assert!(same.filter(|(n, _)| n == name).all(|(_, b)| b == a));
        }
    }

    #[test]
    fn many_equals_one_by_one() {
        // Lengths around SHA-256's 64-byte block and padding edges, mixed in
        // one batch, and batch sizes around the 16-message chunking.
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let lens = [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 4096, 65536];
        for &a in ALGORITHMS {
            let n = a.output_len();
            for count in [0, 1, 2, 3, 4, 5, 15, 16, 17, 33] {
                let msgs: Vec<&[u8]> = (0..count)
                    .map(|i| &data[i..i + lens[i % lens.len()]])
                    .collect();
                let mut many = vec![0xaa; count * n];
                a.digest_many(&msgs, &mut many);
                for (m, d) in msgs.iter().zip(many.chunks(n.max(1))) {
                    let mut one = vec![0; n];
                    a.digest_into(m, &mut one);
                    assert_eq!(d, &one[..], "{a} count {count} len {}", m.len());
                }
            }
        }
    }

    /// aarch64: the block digests run on the ARMv8 SHA-2 instructions where
    /// the CPU has them and on plain NEON lanes where it does not, chosen at
    /// run time (the `sha2` crate's one-message path decides the same way).
    /// scripts/test-cross.sh runs this under QEMU with the instructions and
    /// with them hidden, saying which in BLKHASH_TEST_SHA2 (1 or 0), and
    /// the tests above then check each kernel's digests.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn sha256_kernel_follows_the_cpu() {
        let sha2 = std::arch::is_aarch64_feature_detected!("sha2");
        if let Ok(want) = std::env::var("BLKHASH_TEST_SHA2") {
            assert_eq!(
                sha2,
                want == "1",
                "SHA-2 instructions detected: {sha2}, BLKHASH_TEST_SHA2={want}"
            );
        }
        let kernel = tape_sha256::backend();
        let want = if sha2 { "neon-sha2-x4" } else { "neon-4" };
        assert_eq!(kernel, want, "SHA-2 instructions detected: {sha2}");
    }

    #[test]
    fn one_shot_equals_streaming_and_lengths() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for &a in ALGORITHMS {
            let mut one = vec![0; a.output_len()];
            a.digest_into(&data, &mut one);
            let mut s = a.streaming();
            for c in data.chunks(333) {
                s.update(c);
            }
            assert_eq!(s.finalize(), one, "{a}");
        }
    }

    #[test]
    fn known_answers() {
        // Digests of "abc" from the algorithms' specifications / OpenSSL.
        let cases = [
            ("md5", "900150983cd24fb0d6963f7d28e17f72"),
            ("sha1", "a9993e364706816aba3e25717850c26c9cd0d89d"),
            (
                "sha256",
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            ),
            ("shake128", "5881092dd818bf5cf8a3ddb793fbcba7"),
            // RFC 7693's BLAKE2b with a 32-byte output (hashlib.blake2b(b"abc",
            // digest_size=32)): not the first half of BLAKE2b-512's.
            (
                "blake2b-256",
                "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319",
            ),
            (
                "blake3",
                "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85",
            ),
            (
                "md5-sha1",
                "900150983cd24fb0d6963f7d28e17f72a9993e364706816aba3e25717850c26c9cd0d89d",
            ),
        ];
        for (name, want) in cases {
            let a: Algorithm = name.parse().unwrap();
            let mut out = vec![0; a.output_len()];
            a.digest_into(b"abc", &mut out);
            assert_eq!(hex(&out), want, "{name}");
        }
    }
}
