//! PBS snapshot manifests from untrusted bytes
//! (`blkimage::pbs::manifest::Manifest`, what reading a backup from its
//! datastore checks the index and the key against): the blob, then the
//! JSON (`files[]`, `csum` in hex, `unprotected`, `signature`), as a blob
//! and as JSON alone. What parses answers every question (a file's entry,
//! the fingerprint, the signature and the key check) without panicking.

use blkimage::pbs::manifest::Manifest;
use blkimage::pbs::store::Key;

fn questions(m: &Manifest) {
    let key = Key::new([1; 32]);
    let _ = m.file("drive-scsi0.img.fidx");
    let _ = m.fingerprint();
    assert_eq!(m.signature_with(&key).len(), 64);
    let _ = m.check_key(&key);
}

/// Check one input (see the module doc).
pub fn check(data: &[u8]) {
    if let Ok(m) = Manifest::parse(data) {
        questions(&m);
    }
    if let Ok(m) = Manifest::from_json(data) {
        questions(&m);
    }
}
