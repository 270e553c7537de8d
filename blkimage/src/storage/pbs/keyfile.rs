//! A PBS key file, as `proxmox-backup-client key create` writes it: JSON
//! `{kdf, created, modified, data, fingerprint, hint}`. `kdf: null`:
//! `data` (base64) is the 32-byte key; `{"Scrypt": {n, r, p, salt}}` or
//! `{"PBKDF2": {iter, salt}}`: `data` is `IV(16) || TAG(16) ||
//! ciphertext(32)` under AES-256-GCM (no associated data) with the key
//! derived from the passphrase. The fingerprint, if there, must be the
//! key's.

use super::key::{Key, fingerprint_text};
use aes_gcm::aead::{AeadInOut, KeyInit};
use base64::Engine as _;
use serde_json::Value;

/// The most scrypt may take: PBS refuses parameters needing more than
/// 1 GiB (`128 * r * n * p` bytes); a key file is untrusted input.
const SCRYPT_MAX_BYTES: u128 = 1025 * 1024 * 1024;
/// PBKDF2 iterations at most: PBS writes 65535; a file asking for more
/// than this would keep us busy for hours.
const PBKDF2_MAX_ITER: u64 = 10_000_000;

/// AES-256-GCM with the 16-byte IVs PBS uses.
pub type Aes256Gcm16 = aes_gcm::AesGcm<aes_gcm::aes::Aes256, aes_gcm::aes::cipher::consts::U16>;

/// Whether a key file needs a passphrase (its kdf is not null).
pub fn needs_passphrase(text: &[u8]) -> Result<bool, String> {
    let v: Value = serde_json::from_slice(text).map_err(|e| format!("not a PBS key file: {e}"))?;
    Ok(!v.get("kdf").is_none_or(Value::is_null))
}

fn base64(v: &Value, what: &str) -> Result<Vec<u8>, String> {
    let s = v.as_str().ok_or(format!("{what}: not a string"))?;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("{what}: not base64: {e}"))
}

fn number(v: &Value, what: &str) -> Result<u64, String> {
    v.as_u64().ok_or(format!("{what}: not a number"))
}

/// The key of the key file `text`, with `passphrase` where its kdf needs
/// one; the fingerprint it records checked.
///
/// ```
/// let text = br#"{"kdf": null, "created": "2026-11-28T00:00:00Z",
///   "modified": "2026-11-28T00:00:00Z", "data": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
///   "fingerprint": "0e:ab:d4:46:0b:6e:b9:ca:34:50:23:de:e2:b7:78:c7:90:e5:4a:16:83:b9:65:9c:0a:57:ae:19:90:90:15:9b"}"#;
/// let key = blkimage::pbs::store::keyfile::load(text, None).unwrap();
/// assert_eq!(key.enc_key()[31], 31);
/// ```
pub fn load(text: &[u8], passphrase: Option<&[u8]>) -> Result<Key, String> {
    let v: Value = serde_json::from_slice(text).map_err(|e| format!("not a PBS key file: {e}"))?;
    let data = base64(v.get("data").ok_or("no data")?, "data")?;
    let raw = match v.get("kdf").filter(|k| !k.is_null()) {
        None => data,
        Some(kdf) => {
            let pass =
                passphrase.ok_or("the key is protected by a passphrase, and none was given")?;
            let derived = derive(kdf, pass)?;
            decrypt_key(&derived, &data, v.get("hint").and_then(Value::as_str))?
        }
    };
    let raw: [u8; 32] = raw
        .try_into()
        .map_err(|r: Vec<u8>| format!("a key of {} bytes, not 32", r.len()))?;
    let key = Key::new(raw);
    if let Some(fp) = v.get("fingerprint").and_then(Value::as_str)
        && !fp.eq_ignore_ascii_case(&key.fingerprint_text())
    {
        return Err(format!(
            "it records the fingerprint {fp}, and its key has {}",
            key.fingerprint_text()
        ));
    }
    Ok(key)
}

/// The key the kdf `{"Scrypt": {...}}` or `{"PBKDF2": {...}}` derives
/// from `pass`, its parameters bounded.
fn derive(kdf: &Value, pass: &[u8]) -> Result<[u8; 32], String> {
    let mut out = [0u8; 32];
    if let Some(s) = kdf.get("Scrypt") {
        let (n, r, p) = (
            number(&s["n"], "n")?,
            number(&s["r"], "r")?,
            number(&s["p"], "p")?,
        );
        let salt = base64(&s["salt"], "salt")?;
        if !n.is_power_of_two() || n < 2 || r == 0 || p == 0 || r > u32::MAX as u64 {
            return Err(format!("scrypt parameters n={n} r={r} p={p}: not valid"));
        }
        if 128 * r as u128 * n as u128 * p as u128 > SCRYPT_MAX_BYTES {
            return Err(format!(
                "scrypt parameters n={n} r={r} p={p} need more than 1 GiB"
            ));
        }
        let params = scrypt::Params::new(n.trailing_zeros() as u8, r as u32, p as u32)
            .map_err(|e| format!("scrypt parameters n={n} r={r} p={p}: {e}"))?;
        scrypt::scrypt(pass, &salt, &params, &mut out).map_err(|e| e.to_string())?;
        return Ok(out);
    }
    if let Some(s) = kdf.get("PBKDF2") {
        let iter = number(&s["iter"], "iter")?;
        if iter == 0 || iter > PBKDF2_MAX_ITER {
            return Err(format!(
                "PBKDF2 with {iter} iterations: not 1 to {PBKDF2_MAX_ITER}"
            ));
        }
        let salt = base64(&s["salt"], "salt")?;
        pbkdf2::pbkdf2_hmac::<sha2::Sha256>(pass, &salt, iter as u32, &mut out);
        return Ok(out);
    }
    Err(format!("an unknown kdf: {kdf}"))
}

/// `data` (`IV || TAG || ciphertext`) decrypted with `derived`.
fn decrypt_key(derived: &[u8; 32], data: &[u8], hint: Option<&str>) -> Result<Vec<u8>, String> {
    if data.len() < 32 {
        return Err(format!(
            "its data is {} bytes, shorter than IV and tag",
            data.len()
        ));
    }
    let (iv, rest) = data.split_at(16);
    let (tag, ct) = rest.split_at(16);
    let cipher = Aes256Gcm16::new(derived.into());
    let mut buf = ct.to_vec();
    cipher
        .decrypt_inout_detached(
            iv.try_into().unwrap(),
            b"",
            buf.as_mut_slice().into(),
            tag.try_into().unwrap(),
        )
        .map_err(|_| match hint {
            Some(h) => format!("the passphrase does not open it (its hint: {h})"),
            None => "the passphrase does not open it".to_string(),
        })?;
    Ok(buf)
}

/// The fingerprint of `key` as a key file records it.
pub fn fingerprint_of(key: &Key) -> String {
    fingerprint_text(&key.fingerprint())
}
