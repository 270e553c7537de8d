//! A datastore's chunks: `DATASTORE/.chunks/<first 4 hex digits>/<digest
//! in hex>`, each a blob whose data has the digest it is named by (plain,
//! or keyed for an encrypted backup).

use super::blob;
use super::key::Key;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The chunks of a datastore, read by digest.
#[derive(Debug)]
pub struct ChunkStore {
    dir: PathBuf,
    key: Option<Key>,
}

impl ChunkStore {
    /// The datastore at `dir` (the directory holding `.chunks`); `key` for
    /// an encrypted backup.
    pub fn new(dir: &Path, key: Option<Key>) -> ChunkStore {
        ChunkStore {
            dir: dir.to_path_buf(),
            key,
        }
    }

    /// The key chunks are decrypted and their digests computed with.
    pub fn key(&self) -> Option<&Key> {
        self.key.as_ref()
    }

    /// The digest of `len` zero bytes as [`ChunkStore::digest`] gives it,
    /// streamed from a small block of zeros rather than a chunk's buffer.
    pub fn digest_zeros(&self, len: usize) -> [u8; 32] {
        let key = self.key.as_ref().map_or(&[][..], |k| &k.id_key()[..]);
        let d = blkhash::Algorithm::Sha256.digest_zeros_keyed(len, key);
        d.try_into().expect("a SHA-256 digest is 32 bytes")
    }

    /// The chunk file of `digest`.
    pub fn path(&self, digest: &[u8]) -> PathBuf {
        let hex = blkhash::to_hex(digest);
        self.dir.join(".chunks").join(&hex[..4]).join(hex)
    }

    /// The digest of `data` as the chunks are named: keyed with the key.
    pub fn digest(&self, data: &[u8]) -> [u8; 32] {
        match &self.key {
            Some(k) => k.digest(data),
            None => {
                let mut d = [0u8; 32];
                blkhash::Algorithm::Sha256.digest_into(data, &mut d);
                d
            }
        }
    }

    /// The `len` bytes of the chunk of `digest`: its file read (no more
    /// than a blob of `len` bytes can take), decoded, its length and its
    /// digest checked. The error says why, of the chunk's file.
    pub fn read(&self, digest: &[u8], len: usize) -> Result<Vec<u8>, String> {
        let path = self.path(digest);
        let shown = path.display();
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.renamed_bad(&path) => {
                return Err(format!(
                    "{shown}: missing, renamed .bad by a verify job (damaged)"
                ));
            }
            Err(e) => return Err(format!("{shown}: {}", reason(&e))),
        };
        // A blob holds no more than its data, the header and a GCM tag:
        // compressed data is kept only when smaller.
        let most = len as u64 + 44;
        let mut raw = Vec::new();
        raw.try_reserve_exact(most.min(blob::MAX_CHUNK as u64 + 44) as usize)
            .map_err(|_| format!("{shown}: cannot allocate {most} bytes"))?;
        (&mut f)
            .take(most + 1)
            .read_to_end(&mut raw)
            .map_err(|e| format!("{shown}: {}", reason(&e)))?;
        if raw.len() as u64 > most {
            return Err(format!("{shown}: longer than a blob of a {len}-byte chunk"));
        }
        let data =
            blob::decode(&raw, self.key.as_ref(), len).map_err(|e| format!("{shown}: {e}"))?;
        if data.len() != len {
            return Err(format!(
                "{shown}: {} bytes, not the {len} of its chunk",
                data.len()
            ));
        }
        if self.digest(&data) != digest {
            return Err(format!(
                "{shown}: its data does not have the digest it is named by"
            ));
        }
        Ok(data)
    }

    /// Whether a verify job renamed the chunk `path` (`DIGEST.N.bad`).
    fn renamed_bad(&self, path: &Path) -> bool {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return false;
        };
        let prefix = format!("{}.", name.to_string_lossy());
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with(&prefix) && n.ends_with(".bad")
            })
        })
    }
}

/// An I/O error's words without Rust's " (os error N)".
fn reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(" (os error ") {
        Some((msg, _)) => msg.to_string(),
        None => s,
    }
}
