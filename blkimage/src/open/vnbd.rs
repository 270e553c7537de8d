//! Opening a virtnbdbackup stream with the earlier streams of its disk an
//! incremental one needs, found beside it as virtnbdbackup names them.
//!
//! virtnbdbackup writes `DISK.full.data` (checkpoint `virtnbdbackup.0`),
//! then `DISK.inc.virtnbdbackup.N.data` (checkpoint `virtnbdbackup.N`,
//! parent the checkpoint before); `DISK.diff.TIME.data` and
//! `DISK.copy.data` make no checkpoint of their own. So the parent of a
//! stream whose parent checkpoint is P is `DISK.inc.P.data`, or
//! `DISK.full.data` for the full backup's checkpoint: each is taken only
//! if its metadata says so (disk and checkpoint); a copy stream, which
//! carries the same checkpoint name as the full one, is never a parent.

use crate::OpenOptions;
use crate::formats::vnbd::{self, Stream, Vnbd};
use crate::qcow2::{ImageFile, MAX_CHAIN_DEPTH, Storage};
use crate::storage::RawFile;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn open_storage(path: &Path, opts: &OpenOptions) -> io::Result<Arc<dyn Storage>> {
    let file = RawFile::open_with(path, opts)?;
    file.lock(opts.force_share)?;
    Ok(Arc::new(ImageFile::new(file, path)?))
}

/// The stream in `file` (at `path`, already probed) with its chain.
pub(crate) fn open(file: RawFile, path: &Path, opts: &OpenOptions) -> io::Result<Vnbd> {
    let top: Arc<dyn Storage> = Arc::new(ImageFile::new(file, path)?);
    let mut chain = vec![Stream::parse(path.to_path_buf(), top)?];
    loop {
        let (child, _) = chain.last().expect("not empty");
        let m = child.meta();
        if !m.incremental {
            break;
        }
        if opts.no_backing {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "virtnbdbackup stream '{}': an incremental backup needs the earlier \
                     streams of its disk (files an image refers to are refused)",
                    child.name.display()
                ),
            ));
        }
        if chain.len() >= MAX_CHAIN_DEPTH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "virtnbdbackup stream '{}': a chain deeper than {MAX_CHAIN_DEPTH} streams",
                    path.display()
                ),
            ));
        }
        let parent = find_parent(&child.name, &m.disk, &m.parent, opts)?;
        if chain.iter().any(|(s, _)| s.name == parent) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "virtnbdbackup stream '{}': the chain loops",
                    parent.display()
                ),
            ));
        }
        let st = open_storage(&parent, opts).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("virtnbdbackup stream '{}': {e}", parent.display()),
            )
        })?;
        chain.push(Stream::parse(parent, st)?);
    }
    Vnbd::new(chain)
}

/// The stream beside `child` that holds checkpoint `parent` of `disk`.
fn find_parent(child: &Path, disk: &str, parent: &str, opts: &OpenOptions) -> io::Result<PathBuf> {
    let dir = child.parent().unwrap_or(Path::new(""));
    let names = [
        format!("{disk}.inc.{parent}.data"),
        format!("{disk}.full.data"),
    ];
    let mut seen = Vec::new();
    for name in names {
        let p = dir.join(&name);
        if name.contains('/') || !p.is_file() {
            continue;
        }
        let st = open_storage(&p, opts)?;
        if !vnbd::probe_storage(&*st)? {
            seen.push(format!("'{}' is no virtnbdbackup stream", p.display()));
            continue;
        }
        let m = vnbd::meta(&p, &*st)?;
        if m.disk == disk && m.checkpoint == parent {
            return Ok(p);
        }
        seen.push(format!(
            "'{}' holds checkpoint '{}' of disk '{}'",
            p.display(),
            m.checkpoint,
            m.disk
        ));
    }
    let mut msg = format!(
        "virtnbdbackup stream '{}': a gap in the chain: no stream of disk '{disk}' with its \
         parent checkpoint '{parent}' beside it (looked for {disk}.inc.{parent}.data and \
         {disk}.full.data)",
        child.display()
    );
    if !seen.is_empty() {
        msg += &format!("; {}", seen.join("; "));
    }
    Err(io::Error::new(io::ErrorKind::NotFound, msg))
}
