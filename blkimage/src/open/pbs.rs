//! A Proxmox Backup Server fixed index opened as the disk it holds: its
//! datastore found above it, its manifest checked (the index's csum and
//! size, the key's fingerprint and the signature), the key loaded for an
//! encrypted backup.

use crate::formats::pbs::image::PbsImage;
use crate::formats::pbs::manifest::{MAX_MANIFEST, Manifest};
use crate::formats::pbs::{self, NoDatastore};
use crate::open::{Input, OpenOptions};
use crate::storage::pbs::{ChunkStore, Key, keyfile};
use std::io::{self, Read};
use std::path::Path;

/// The environment variable the passphrase of a key file is taken from,
/// as proxmox-backup-client takes it.
pub const PASSWORD_ENV: &str = "PBS_ENCRYPTION_PASSWORD";

fn invalid(what: impl std::fmt::Display, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {why}"))
}

/// The disk the index at `path` holds. Its datastore is looked for above
/// it; without one, an error carrying [`NoDatastore`] (what the index
/// alone gives is the caller's to take).
pub fn open(path: &Path, opts: &OpenOptions) -> io::Result<Input> {
    Ok(Input::Image(Box::new(open_image(path, opts)?)))
}

/// The image `open` gives, as itself: a caller that wants only the chunks
/// checked ([`PbsImage::check_chunks`]) takes it so.
pub fn open_image(path: &Path, opts: &OpenOptions) -> io::Result<PbsImage> {
    let mut reader = pbs::open_fidx(path)?;
    let header = reader.header().clone();
    let Some(store) = pbs::find_datastore(path) else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            NoDatastore {
                index: path.to_path_buf(),
                header,
            },
        ));
    };
    // Checked whole before a chunk is read: its length, its index_csum.
    reader.checksum()?;
    let canon = std::fs::canonicalize(path)?;
    let dir = canon.parent().unwrap_or(Path::new("/"));
    let snapshot = dir
        .strip_prefix(&store)
        .unwrap_or(dir)
        .display()
        .to_string();
    let key = opts
        .keyfile
        .as_deref()
        .map(|k| load_key(k, opts))
        .transpose()?;
    match check_manifest(path, &header, key.as_ref(), false)? {
        Some(_) => {}
        None => {
            let m = canon.with_file_name("index.json.blob");
            return Err(crate::with_context(
                io::Error::from(io::ErrorKind::NotFound),
                format!("{}: the snapshot's manifest", m.display()),
            ));
        }
    }
    let store = ChunkStore::new(&store, key);
    let index = std::fs::File::open(path)?;
    PbsImage::new(path.to_path_buf(), index, header, store, snapshot)
}

/// What the manifest beside the index at `path` (`index.json.blob`, if
/// there is one: `None` if not) says of it, checked: it lists the index
/// with its `index_csum` and size (`header`'s); an encrypted backup's
/// needs `key`, whose fingerprint must be the one it records (and its
/// signature the one the key gives, whatever the backup); where its
/// `digests` are to be compared with keyed ones, an unencrypted backup's
/// refuses a key: its plain digests would all differ.
///
/// The one check of a key against a backup, for the datastore read as an
/// image and for an index compared as digests alike: a wrong key is an
/// error naming both fingerprints, never "every block differs".
pub fn check_manifest(
    path: &Path,
    header: &pbs::FidxHeader,
    key: Option<&Key>,
    digests: bool,
) -> io::Result<Option<Manifest>> {
    let canon = std::fs::canonicalize(path)?;
    let manifest_path = canon.with_file_name("index.json.blob");
    if !manifest_path.exists() {
        return Ok(None);
    }
    let name = canon.file_name().unwrap_or_default().to_string_lossy();
    let manifest = read_manifest(&manifest_path)?;
    let info = manifest
        .file(&name)
        .map_err(|why| invalid(manifest_path.display(), why))?;
    if (info.csum, info.size) != (header.index_csum, header.size) {
        return Err(invalid(
            path.display(),
            format!(
                "not the index the manifest {} lists (its csum {} and size {}; the index's {} \
                 and {})",
                manifest_path.display(),
                blkhash::to_hex(&info.csum),
                info.size,
                blkhash::to_hex(&header.index_csum),
                header.size
            ),
        ));
    }
    match (key, info.crypt_mode.as_str()) {
        (None, "encrypt") => Err(invalid(
            path.display(),
            format!(
                "an encrypted backup (its manifest says so: key {}): its key file is needed",
                manifest.fingerprint().unwrap_or("unknown")
            ),
        )),
        (Some(key), mode) => {
            (manifest.check_key(key)).map_err(|why| invalid(manifest_path.display(), why))?;
            if digests && mode != "encrypt" {
                return Err(invalid(
                    path.display(),
                    format!(
                        "a backup not encrypted (its manifest says crypt-mode {mode}) compared \
                         with a key (key {}): its digests are not keyed",
                        key.fingerprint_text()
                    ),
                ));
            }
            Ok(Some(manifest))
        }
        (None, _) => Ok(Some(manifest)),
    }
}

/// The manifest at `path`, read within its bound and parsed.
fn read_manifest(path: &Path) -> io::Result<Manifest> {
    let f = std::fs::File::open(path).map_err(|e| {
        crate::with_context(e, format!("{}: the snapshot's manifest", path.display()))
    })?;
    let mut raw = Vec::new();
    f.take(MAX_MANIFEST as u64 + 64).read_to_end(&mut raw)?;
    Manifest::parse(&raw).map_err(|why| invalid(path.display(), why))
}

/// The key in the key file `path`, its passphrase (if its kdf needs one)
/// from [`PASSWORD_ENV`], else the first line of `opts.secret_file`.
///
/// The key file and its passphrase are read each time; the key they give
/// is kept for the process, by their SHA-256 (never the passphrase
/// itself): a command checks the key against the manifest, opens the
/// index and hashes with it, and a key under a passphrase costs scrypt's
/// 64 MiB and a few tenths of a second each time. Another passphrase, or
/// the file changed, is another key (or an error), as when first read.
pub fn load_key(path: &Path, opts: &OpenOptions) -> io::Result<Key> {
    use sha2::{Digest, Sha256};
    static LOADED: std::sync::Mutex<Vec<([u8; 32], Key)>> = std::sync::Mutex::new(Vec::new());
    let shown = path.display();
    let mut text = Vec::new();
    std::fs::File::open(path)
        .map_err(|e| crate::with_context(e, format!("{shown}: the key file")))?
        .take(1 << 20)
        .read_to_end(&mut text)?;
    let pass = match keyfile::needs_passphrase(&text).map_err(|why| invalid(&shown, why))? {
        false => None,
        true => Some(passphrase(opts).map_err(|why| invalid(&shown, why))?),
    };
    let mut h = Sha256::new();
    h.update((text.len() as u64).to_le_bytes());
    h.update(&text);
    h.update(pass.as_deref().unwrap_or_default());
    let id: [u8; 32] = h.finalize().into();
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, key)) = loaded.iter().find(|(i, _)| *i == id) {
        return Ok(key.clone());
    }
    let key = keyfile::load(&text, pass.as_deref()).map_err(|why| invalid(&shown, why))?;
    loaded.push((id, key.clone()));
    Ok(key)
}

fn passphrase(opts: &OpenOptions) -> Result<Vec<u8>, String> {
    if let Some(p) = std::env::var_os(PASSWORD_ENV) {
        use std::os::unix::ffi::OsStrExt;
        return Ok(p.as_bytes().to_vec());
    }
    let Some(file) = &opts.secret_file else {
        return Err(format!(
            "its key is protected by a passphrase: give it in {PASSWORD_ENV} or a file"
        ));
    };
    let text = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
    Ok(line.strip_suffix(b"\r").unwrap_or(line).to_vec())
}
