//! Proxmox Backup Server datastores written as PBS writes them, from the
//! published format (proxmox-backup's `docs/file-formats.rst`, and the
//! facts of its source: blobs, keyed digests, key files, manifests), for
//! the tests of blkimage's reader. No PBS runs here; this encoder shares
//! no code with the decoder it tests (only the RustCrypto and zstd
//! crates, as PBS shares OpenSSL and zstd between its two sides).
//!
//! A datastore: `DIR/.chunks/XXXX/DIGEST` (each chunk a blob), and per
//! snapshot `DIR/[ns/NS/]vm/ID/TIME/` holding `drive-scsi0.img.fidx` and
//! `index.json.blob`.

use aes_gcm::aead::{AeadInOut, KeyInit};
use base64::Engine as _;
use hmac::Mac;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const BLOB_PLAIN: [u8; 8] = [66, 171, 56, 7, 190, 131, 112, 161];
const BLOB_ZSTD: [u8; 8] = [49, 185, 88, 66, 111, 182, 163, 127];
const BLOB_ENC: [u8; 8] = [123, 103, 133, 190, 34, 45, 76, 240];
const BLOB_ZSTD_ENC: [u8; 8] = [230, 89, 27, 191, 11, 191, 216, 11];
const FIDX: [u8; 8] = [47, 127, 65, 237, 145, 253, 15, 205];

type Gcm16 = aes_gcm::AesGcm<aes_gcm::aes::Aes256, aes_gcm::aes::cipher::consts::U16>;

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An encryption key as PBS derives from it: the id key.
pub fn id_key(key: &[u8; 32]) -> [u8; 32] {
    let mut id = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(key, b"_id_key", 10, &mut id);
    id
}

/// The digest of a chunk: SHA-256, keyed (`SHA-256(data || id key)`) for
/// an encrypted backup.
pub fn chunk_digest(data: &[u8], key: Option<&[u8; 32]>) -> [u8; 32] {
    match key {
        Some(k) => sha256(&[data, &id_key(k)]),
        None => sha256(&[data]),
    }
}

/// The key's fingerprint as PBS writes it (hex bytes joined by colons).
pub fn fingerprint(key: &[u8; 32]) -> String {
    let input = sha256(&[b"Proxmox Backup Encryption Key Fingerprint"]);
    let fp = chunk_digest(&input, Some(key));
    let parts: Vec<String> = fp.iter().map(|b| format!("{b:02x}")).collect();
    parts.join(":")
}

/// AES-256-GCM of `data` under `key` with the 16-byte `iv`: the
/// ciphertext and the tag.
fn seal(key: &[u8; 32], iv: &[u8; 16], data: &[u8]) -> (Vec<u8>, [u8; 16]) {
    let mut buf = data.to_vec();
    let tag = Gcm16::new(key.into())
        .encrypt_inout_detached(iv.into(), b"", buf.as_mut_slice().into())
        .expect("encrypts");
    (buf, tag.into())
}

/// A blob of `data` as PBS encodes one: compressed (zstd, level 1) when
/// asked and smaller, encrypted with `key`; the CRC over what follows the
/// header.
pub fn blob(data: &[u8], compress: bool, key: Option<&[u8; 32]>) -> Vec<u8> {
    let packed = compress
        .then(|| zstd::bulk::compress(data, 1).expect("compresses"))
        .filter(|c| c.len() < data.len());
    let (magic, body, head_extra) = match (key, &packed) {
        (None, None) => (BLOB_PLAIN, data.to_vec(), Vec::new()),
        (None, Some(c)) => (BLOB_ZSTD, c.clone(), Vec::new()),
        (Some(k), p) => {
            // A fresh IV per blob, as PBS draws one (here from the data
            // and a counter: the tests need no secrecy).
            let iv: [u8; 16] = sha256(&[b"iv", data])[..16].try_into().unwrap();
            let plain = p.as_deref().unwrap_or(data);
            let (ct, tag) = seal(k, &iv, plain);
            let magic = if p.is_some() { BLOB_ZSTD_ENC } else { BLOB_ENC };
            (magic, ct, [&iv[..], &tag[..]].concat())
        }
    };
    let crc = crc32fast::hash(&body);
    [&magic[..], &crc.to_le_bytes(), &head_extra, &body].concat()
}

/// How a key file protects its key.
#[derive(Clone, Copy, Debug)]
pub enum Kdf {
    /// `kdf: null`: the key in the clear.
    None,
    /// scrypt with PBS's parameters (n 65536, r 8, p 1).
    Scrypt,
    /// PBKDF2-HMAC-SHA256, PBS's 65535 iterations.
    Pbkdf2,
}

/// A key file of `key` as `proxmox-backup-client key create --kdf KDF`
/// writes it, protected by `pass`.
pub fn key_file(key: &[u8; 32], kdf: Kdf, pass: &[u8]) -> String {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let salt = sha256(&[b"salt", key]);
    let mut derived = [0u8; 32];
    let (kdf_json, data) = match kdf {
        Kdf::None => ("null".to_string(), key.to_vec()),
        Kdf::Scrypt | Kdf::Pbkdf2 => {
            let json = match kdf {
                Kdf::Scrypt => {
                    let params = scrypt::Params::new(16, 8, 1).unwrap();
                    scrypt::scrypt(pass, &salt, &params, &mut derived).unwrap();
                    format!(
                        r#"{{"Scrypt":{{"n":65536,"r":8,"p":1,"salt":"{}"}}}}"#,
                        b64(&salt)
                    )
                }
                _ => {
                    pbkdf2::pbkdf2_hmac::<Sha256>(pass, &salt, 65535, &mut derived);
                    format!(r#"{{"PBKDF2":{{"iter":65535,"salt":"{}"}}}}"#, b64(&salt))
                }
            };
            let iv: [u8; 16] = sha256(&[b"key iv", key])[..16].try_into().unwrap();
            let (ct, tag) = seal(&derived, &iv, key);
            (json, [&iv[..], &tag[..], &ct].concat())
        }
    };
    format!(
        r#"{{"kdf":{kdf_json},"created":"2026-11-28T10:00:00Z","modified":"2026-11-28T10:00:00Z","data":"{}","fingerprint":"{}","hint":"the test passphrase"}}"#,
        b64(&data),
        fingerprint(key)
    )
}

/// A backup to write.
#[derive(Clone, Debug)]
pub struct Backup<'a> {
    /// The disk's bytes.
    pub data: &'a [u8],
    /// Bytes per chunk (PBS: 4 MiB).
    pub chunk: usize,
    /// Chunks compressed with zstd where that makes them smaller.
    pub compress: bool,
    /// The encryption key of an encrypted backup.
    pub key: Option<[u8; 32]>,
    /// A namespace (`ns/NAME/` before `vm/`).
    pub ns: Option<&'a str>,
    /// The VM's id.
    pub vmid: u32,
    /// The snapshot's time (RFC 3339) and as seconds since the epoch.
    pub time: (&'a str, i64),
}

impl Backup<'_> {
    /// A plain backup of `data` in 4 MiB chunks of VM 100.
    pub fn of(data: &[u8]) -> Backup<'_> {
        Backup {
            data,
            chunk: 4 << 20,
            compress: true,
            key: None,
            ns: None,
            vmid: 100,
            time: ("2026-11-28T10:00:00Z", 1_764_324_000),
        }
    }
}

/// Write `b` into the datastore at `store` (its chunks, the snapshot's
/// index and manifest); the index's path.
pub fn write_backup(store: &Path, b: &Backup<'_>) -> PathBuf {
    let key = b.key.as_ref();
    std::fs::create_dir_all(store.join(".chunks")).unwrap();
    let mut digests = Vec::new();
    for c in b.data.chunks(b.chunk) {
        let d = chunk_digest(c, key);
        let dir = store.join(".chunks").join(&hex(&d)[..4]);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(hex(&d));
        if !path.exists() {
            std::fs::write(&path, blob(c, b.compress, key)).unwrap();
        }
        digests.extend_from_slice(&d);
    }
    let csum = sha256(&[&digests]);
    let mut fidx = vec![0u8; 4096];
    fidx[..8].copy_from_slice(&FIDX);
    fidx[8..24].copy_from_slice(&sha256(&[b"uuid", &csum])[..16]);
    fidx[24..32].copy_from_slice(&b.time.1.to_le_bytes());
    fidx[32..64].copy_from_slice(&csum);
    fidx[64..72].copy_from_slice(&(b.data.len() as u64).to_le_bytes());
    fidx[72..80].copy_from_slice(&(b.chunk as u64).to_le_bytes());
    fidx.extend_from_slice(&digests);
    let mut snap = store.to_path_buf();
    if let Some(ns) = b.ns {
        snap = snap.join("ns").join(ns);
    }
    let snap = snap.join("vm").join(b.vmid.to_string()).join(b.time.0);
    std::fs::create_dir_all(&snap).unwrap();
    let index = snap.join("drive-scsi0.img.fidx");
    std::fs::write(&index, &fidx).unwrap();
    let manifest = manifest(b, &csum);
    std::fs::write(
        snap.join("index.json.blob"),
        blob(manifest.as_bytes(), false, None),
    )
    .unwrap();
    index
}

/// The manifest of the backup `b` whose index has `csum`: signed, and the
/// key's fingerprint recorded, for an encrypted one.
pub fn manifest(b: &Backup<'_>, csum: &[u8; 32]) -> String {
    let mode = if b.key.is_some() { "encrypt" } else { "none" };
    // Canonical JSON (keys sorted, no spaces), written out by hand.
    let signed = format!(
        r#"{{"backup-id":"{}","backup-time":{},"backup-type":"vm","files":[{{"crypt-mode":"{mode}","csum":"{}","filename":"drive-scsi0.img.fidx","size":{}}}]}}"#,
        b.vmid,
        b.time.1,
        hex(csum),
        b.data.len()
    );
    let Some(key) = &b.key else {
        return signed.replacen('{', r#"{"unprotected":{},"signature":null,"#, 1);
    };
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&id_key(key)).unwrap();
    mac.update(signed.as_bytes());
    let sig = hex(&mac.finalize().into_bytes());
    signed.replacen(
        '{',
        &format!(
            r#"{{"unprotected":{{"key-fingerprint":"{}"}},"signature":"{sig}","#,
            fingerprint(key)
        ),
        1,
    )
}
