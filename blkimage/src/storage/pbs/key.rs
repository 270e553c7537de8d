//! A backup's encryption key, and what PBS derives from it: the keyed
//! chunk digest, the manifest's signature and the key's fingerprint.

use hmac::{KeyInit as _, Mac};
use sha2::{Digest, Sha256};

/// `SHA-256("Proxmox Backup Encryption Key Fingerprint")`: hashed with the
/// id key, the key's fingerprint.
const FINGERPRINT_INPUT: [u8; 32] = [
    110, 208, 239, 119, 71, 31, 255, 77, 85, 199, 168, 254, 74, 157, 182, 33, 97, 64, 127, 19, 76,
    114, 93, 223, 48, 153, 45, 37, 236, 69, 237, 38,
];

/// An AES-256 key and its id key, `PBKDF2-HMAC-SHA256(key, "_id_key", 10
/// iterations)`: the chunk digests and the manifest's signature use the
/// id key, so that they say nothing of the data to whoever lacks the key.
#[derive(Clone)]
pub struct Key {
    enc: [u8; 32],
    id: [u8; 32],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.fingerprint_text())
    }
}

impl Key {
    /// The key of these 32 bytes.
    ///
    /// ```
    /// // proxmox-backup's own vector (pbs-key-config): the key 0, 1, ... 31.
    /// let key: Vec<u8> = (0u8..32).collect();
    /// let key = blkimage::pbs::store::Key::new(key.try_into().unwrap());
    /// assert_eq!(
    ///     key.fingerprint_text(),
    ///     "0e:ab:d4:46:0b:6e:b9:ca:34:50:23:de:e2:b7:78:c7:90:e5:4a:16:83:b9:65:9c:0a:57:ae:19:90:90:15:9b"
    /// );
    /// ```
    pub fn new(enc: [u8; 32]) -> Key {
        let mut id = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(&enc, b"_id_key", 10, &mut id);
        Key { enc, id }
    }

    /// The AES-256 key.
    pub fn enc_key(&self) -> &[u8; 32] {
        &self.enc
    }

    /// The id key: what a chunk's digest is keyed with (its suffix).
    pub fn id_key(&self) -> &[u8; 32] {
        &self.id
    }

    /// A chunk's keyed digest: `SHA-256(data || id key)`.
    pub fn digest(&self, data: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(data);
        h.update(self.id);
        h.finalize().into()
    }

    /// HMAC-SHA256 of `data` keyed with the id key (a manifest's signature).
    pub fn auth_tag(&self, data: &[u8]) -> [u8; 32] {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.id).expect("any key length");
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    /// The key's fingerprint: the keyed digest of `FINGERPRINT_INPUT`.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.digest(&FINGERPRINT_INPUT)
    }

    /// The fingerprint as PBS writes it: hex bytes joined by colons.
    pub fn fingerprint_text(&self) -> String {
        fingerprint_text(&self.fingerprint())
    }
}

/// A fingerprint as PBS writes it: hex bytes joined by colons.
pub fn fingerprint_text(fp: &[u8]) -> String {
    let hex: Vec<String> = fp.iter().map(|b| format!("{b:02x}")).collect();
    hex.join(":")
}
