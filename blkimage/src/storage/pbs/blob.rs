//! PBS data blobs (chunks, and small files such as the manifest):
//! `MAGIC(8) || CRC32(4, little-endian, IEEE, over what follows the
//! header) || data`, the data plain, zstd-compressed, encrypted (`IV(16)
//! || TAG(16) || AES-256-GCM ciphertext`, in the header) or compressed
//! then encrypted. Every size comes from the caller (a chunk's length is
//! the index's): a blob that would decode to more is refused as soon as it
//! does, never allocated.

use super::key::Key;
use super::keyfile::Aes256Gcm16;
use aes_gcm::aead::{AeadInOut, KeyInit};
use std::io::Read;

/// `SHA-256("Proxmox Backup uncompressed blob v1.0")[..8]`.
pub const PLAIN: [u8; 8] = [66, 171, 56, 7, 190, 131, 112, 161];
/// `SHA-256("Proxmox Backup zstd compressed blob v1.0")[..8]`.
pub const ZSTD: [u8; 8] = [49, 185, 88, 66, 111, 182, 163, 127];
/// `SHA-256("Proxmox Backup encrypted blob v1.0")[..8]`.
pub const ENCRYPTED: [u8; 8] = [123, 103, 133, 190, 34, 45, 76, 240];
/// `SHA-256("Proxmox Backup zstd compressed encrypted blob v1.0")[..8]`.
pub const ZSTD_ENCRYPTED: [u8; 8] = [230, 89, 27, 191, 11, 191, 216, 11];

/// The most a chunk holds (PBS's chunks are at most 16 MiB).
pub const MAX_CHUNK: usize = 16 << 20;

/// The bytes of a blob's header for `magic`: 12, or 44 encrypted.
pub fn header_len(magic: &[u8]) -> Option<usize> {
    match <[u8; 8]>::try_from(magic).ok()? {
        PLAIN | ZSTD => Some(12),
        ENCRYPTED | ZSTD_ENCRYPTED => Some(44),
        _ => None,
    }
}

/// Whether the blob `raw` is encrypted (by its magic).
pub fn is_encrypted(raw: &[u8]) -> bool {
    raw.get(..8)
        .is_some_and(|m| m == ENCRYPTED || m == ZSTD_ENCRYPTED)
}

/// A buffer of `n` bytes, or an error: sizes come from the input.
fn buffer(n: usize) -> Result<Vec<u8>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| format!("cannot allocate {n} bytes"))?;
    Ok(v)
}

/// The data of the blob `raw`: its CRC checked, decrypted with `key`,
/// decompressed; at most `max` bytes (an error past them).
///
/// ```
/// use blkimage::pbs::store::blob;
/// let mut raw = blob::PLAIN.to_vec();
/// raw.extend_from_slice(&crc32fast::hash(b"data").to_le_bytes());
/// raw.extend_from_slice(b"data");
/// assert_eq!(blob::decode(&raw, None, 4).unwrap(), b"data");
/// assert!(blob::decode(&raw, None, 3).unwrap_err().contains("more than 3 bytes"));
/// raw[12] ^= 1;
/// assert!(blob::decode(&raw, None, 4).unwrap_err().contains("CRC"));
/// ```
pub fn decode(raw: &[u8], key: Option<&Key>, max: usize) -> Result<Vec<u8>, String> {
    let magic = raw
        .get(..8)
        .ok_or(format!("{} bytes: not a blob", raw.len()))?;
    let head = header_len(magic).ok_or("a bad magic: not a PBS blob")?;
    if raw.len() < head {
        return Err(format!(
            "{} bytes, shorter than its {head}-byte header",
            raw.len()
        ));
    }
    let crc = u32::from_le_bytes(raw[8..12].try_into().unwrap());
    let body = &raw[head..];
    if crc32fast::hash(body) != crc {
        return Err("its CRC does not match its bytes: damaged".into());
    }
    let too_big = || format!("it holds more than {max} bytes");
    match <[u8; 8]>::try_from(magic).unwrap() {
        PLAIN if body.len() > max => Err(too_big()),
        PLAIN => {
            let mut v = buffer(body.len())?;
            v.extend_from_slice(body);
            Ok(v)
        }
        ZSTD => unzstd(body, max),
        m => {
            let key = key.ok_or("an encrypted chunk, and no key was given")?;
            if body.len() > max + 64 {
                return Err(too_big());
            }
            let mut plain = buffer(body.len())?;
            plain.extend_from_slice(body);
            let cipher = Aes256Gcm16::new(key.enc_key().into());
            let (iv, tag) = (&raw[12..28], &raw[28..44]);
            cipher
                .decrypt_inout_detached(
                    iv.try_into().unwrap(),
                    b"",
                    plain.as_mut_slice().into(),
                    tag.try_into().unwrap(),
                )
                .map_err(|_| "its GCM tag does not match: damaged, or another key's".to_string())?;
            match m {
                ZSTD_ENCRYPTED => unzstd(&plain, max),
                _ if plain.len() > max => Err(too_big()),
                _ => Ok(plain),
            }
        }
    }
}

/// `body` decompressed: at most `max` bytes, refused as soon as it would
/// be more (a zstd bomb allocates nothing past the bound).
fn unzstd(body: &[u8], max: usize) -> Result<Vec<u8>, String> {
    // In one call into a buffer of the bound (and a byte): the streaming
    // decoder below took 1.5x the time of a whole read of a backup, most
    // of it the system's (pages faulted in as it went). Past the bound,
    // or damaged, the streaming decoder says which.
    let mut out = buffer(max.min(MAX_CHUNK) + 1)?;
    if let Ok(n) = zstd::bulk::decompress_to_buffer(body, &mut out)
        && n <= max
    {
        return Ok(out);
    }
    out.clear();
    let dec = zstd::stream::read::Decoder::with_buffer(body).map_err(|e| format!("zstd: {e}"))?;
    dec.take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zstd: {e}"))?;
    if out.len() > max {
        return Err(format!("it holds more than {max} bytes"));
    }
    Ok(out)
}
