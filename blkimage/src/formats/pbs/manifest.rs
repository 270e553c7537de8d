//! A snapshot's manifest, `index.json.blob`: a blob holding JSON with
//! `files[]` (`filename`, `crypt-mode`, `size`, `csum`: an index's
//! `index_csum`, in hex), `unprotected` (`key-fingerprint`, for an
//! encrypted backup) and `signature` (HMAC-SHA256 with the key's id key
//! over the canonical JSON of the rest: keys sorted, no spaces).

use crate::storage::pbs::{Key, blob};
use serde_json::Value;

/// The largest manifest read: a snapshot lists a few files.
pub const MAX_MANIFEST: usize = 16 << 20;

/// A parsed manifest.
#[derive(Debug)]
pub struct Manifest {
    json: Value,
}

/// What a manifest says of one file.
#[derive(Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// "none", "encrypt" or "sign-only".
    pub crypt_mode: String,
    /// The image's size, for an index.
    pub size: u64,
    /// The index's `index_csum`.
    pub csum: [u8; 32],
}

impl Manifest {
    /// The manifest in the blob `raw`.
    pub fn parse(raw: &[u8]) -> Result<Manifest, String> {
        let data = blob::decode(raw, None, MAX_MANIFEST)?;
        Manifest::from_json(&data)
    }

    /// The manifest of the JSON `data` (a blob's content).
    pub fn from_json(data: &[u8]) -> Result<Manifest, String> {
        let json: Value = serde_json::from_slice(data).map_err(|e| format!("not JSON: {e}"))?;
        if !json.is_object() || !json["files"].is_array() {
            return Err("no files[]: not a backup manifest".into());
        }
        Ok(Manifest { json })
    }

    /// What the manifest says of `name`.
    pub fn file(&self, name: &str) -> Result<FileInfo, String> {
        let files = self.json["files"].as_array().expect("checked");
        let f = (files.iter())
            .find(|f| f["filename"].as_str() == Some(name))
            .ok_or(format!("it lists no file {name}"))?;
        let csum = (f["csum"].as_str())
            .and_then(|h| blkhash::Checksum::from_hex(blkhash::Algorithm::Sha256, h).ok())
            .and_then(|c| <[u8; 32]>::try_from(c.as_bytes()).ok())
            .ok_or(format!("{name}: its csum is not 32 bytes in hex"))?;
        Ok(FileInfo {
            crypt_mode: f["crypt-mode"].as_str().unwrap_or("none").to_string(),
            size: f["size"].as_u64().ok_or(format!("{name}: no size"))?,
            csum,
        })
    }

    /// The fingerprint of the key of an encrypted backup, as recorded.
    pub fn fingerprint(&self) -> Option<&str> {
        self.json["unprotected"]["key-fingerprint"].as_str()
    }

    /// The signature `key` gives the manifest (hex): HMAC-SHA256 with its
    /// id key over the canonical JSON without `unprotected` and
    /// `signature`.
    pub fn signature_with(&self, key: &Key) -> String {
        let mut signed = self.json.clone();
        let obj = signed.as_object_mut().expect("checked");
        obj.remove("unprotected");
        obj.remove("signature");
        let mut text = Vec::new();
        canonical(&signed, &mut text);
        blkhash::to_hex(&key.auth_tag(&text))
    }

    /// The fingerprint recorded is `key`'s, and the signature (if any) is
    /// the one `key` gives.
    pub fn check_key(&self, key: &Key) -> Result<(), String> {
        if let Some(fp) = self.fingerprint()
            && !fp.eq_ignore_ascii_case(&key.fingerprint_text())
        {
            return Err(format!(
                "the backup was made with the key {fp}, and the key given is {}",
                key.fingerprint_text()
            ));
        }
        match self.json["signature"].as_str() {
            Some(sig) if !sig.eq_ignore_ascii_case(&self.signature_with(key)) => {
                Err("its signature is not the key's: the manifest was changed".into())
            }
            _ => Ok(()),
        }
    }
}

/// `v` as canonical JSON: object keys sorted by their bytes, no spaces,
/// serde_json's escaping of strings and numbers.
fn canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(serde_json::to_vec(k).expect("a string"));
                out.push(b':');
                canonical(&m[k], out);
            }
            out.push(b'}');
        }
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(x, out);
            }
            out.push(b']');
        }
        v => out.extend(serde_json::to_vec(v).expect("a value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// proxmox-backup's `test_manifest_signature`: the key scrypt("test",
    /// empty salt, n 65536, r 8, p 1), snapshot host/elsa/2020-06-26T13:56:05Z.
    #[test]
    fn the_published_signature() {
        let mut k = [0u8; 32];
        let params = scrypt::Params::new(16, 8, 1).unwrap();
        scrypt::scrypt(b"test", b"", &params, &mut k).unwrap();
        let key = Key::new(k);
        let text = format!(
            r#"{{"backup-type": "host", "backup-id": "elsa", "backup-time": 1593179765,
            "files": [{{"filename": "test1.img.fidx", "crypt-mode": "encrypt", "size": 200,
            "csum": "{}"}}, {{"filename": "abc.blob", "crypt-mode": "none", "size": 200,
            "csum": "{}"}}], "unprotected": {{"note": "This is not protected by the signature."}},
            "signature": null}}"#,
            "01".repeat(32),
            "02".repeat(32)
        );
        let m = Manifest::from_json(text.as_bytes()).unwrap();
        assert_eq!(
            m.signature_with(&key),
            "d7b446fb7db081662081d4b40fedd858a1d6307a5aff4ecff7d5bf4fd35679e9"
        );
        let f = m.file("test1.img.fidx").unwrap();
        assert_eq!(
            (f.crypt_mode.as_str(), f.size, f.csum),
            ("encrypt", 200, [1u8; 32])
        );
    }
}
