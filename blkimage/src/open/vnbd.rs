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
//!
//! The same over HTTP(S): the parents of a stream at a URL are the URLs
//! of those names beside it ([`HttpUrl::sibling`]), a missing one (404)
//! as a missing file.

use crate::OpenOptions;
use crate::formats::vnbd::{self, Stream, Vnbd, named};
use crate::qcow2::MAX_CHAIN_DEPTH;
use crate::storage::http::{Http, HttpUrl};
use crate::storage::{ImageFile, RawFile, Storage};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a stream lies, and so where its parents are looked for.
trait Place: Sized {
    /// Its name in messages (and the stream's name).
    fn name(&self) -> PathBuf;
    /// The name of a stream called `file` (a name, no `/`) beside it, for
    /// messages.
    fn beside(&self, file: &str) -> PathBuf;
    /// The stream called `file` (a name, no `/`) beside it, opened; `None`
    /// if there is none.
    fn sibling(
        &self,
        file: &str,
        opts: &OpenOptions,
    ) -> io::Result<Option<(Self, Arc<dyn Storage>)>>;
}

impl Place for PathBuf {
    fn name(&self) -> PathBuf {
        self.clone()
    }

    fn beside(&self, file: &str) -> PathBuf {
        self.parent().unwrap_or(Path::new("")).join(file)
    }

    fn sibling(
        &self,
        file: &str,
        opts: &OpenOptions,
    ) -> io::Result<Option<(Self, Arc<dyn Storage>)>> {
        let p = self.beside(file);
        if !p.is_file() {
            return Ok(None);
        }
        let st = RawFile::open_with(&p, opts).and_then(|f| {
            f.lock(opts.force_share)?;
            ImageFile::new(f, &p)
        });
        let st = st.map_err(|e| named(&p, e))?;
        Ok(Some((p, Arc::new(st))))
    }
}

impl Place for HttpUrl {
    fn name(&self) -> PathBuf {
        PathBuf::from(self.shown())
    }

    fn beside(&self, file: &str) -> PathBuf {
        match self.sibling(file.as_bytes()) {
            Ok(url) => PathBuf::from(url.shown()),
            Err(_) => PathBuf::from(file),
        }
    }

    fn sibling(
        &self,
        file: &str,
        opts: &OpenOptions,
    ) -> io::Result<Option<(Self, Arc<dyn Storage>)>> {
        let url = self.sibling(file.as_bytes())?;
        match Http::open(&url, &opts.http) {
            Ok(http) => Ok(Some((url, Arc::new(http)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(named(&url.name(), e)),
        }
    }
}

/// The stream in `file` (at `path`, already probed) with its chain.
pub(crate) fn open(file: RawFile, path: &Path, opts: &OpenOptions) -> io::Result<Vnbd> {
    let top: Arc<dyn Storage> = Arc::new(ImageFile::new(file, path)?);
    open_chain(path.to_path_buf(), top, opts)
}

/// The stream at `url` (already probed) with its chain, beside it.
pub(crate) fn open_url(http: Http, opts: &OpenOptions) -> io::Result<Vnbd> {
    let url = http.url().clone();
    open_chain(url, Arc::new(http), opts)
}

/// The stream `top` at `place` and the streams it builds on, found beside it.
fn open_chain<P: Place>(place: P, top: Arc<dyn Storage>, opts: &OpenOptions) -> io::Result<Vnbd> {
    let first = place.name();
    let mut chain = vec![Stream::parse(first.clone(), top)?];
    let mut place = place;
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
                    first.display()
                ),
            ));
        }
        let (parent, st) = find_parent(&place, &child.name, &m.disk, &m.parent, opts)?;
        let name = parent.name();
        if chain.iter().any(|(s, _)| s.name == name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("virtnbdbackup stream '{}': the chain loops", name.display()),
            ));
        }
        chain.push(Stream::parse(name, st)?);
        place = parent;
    }
    Vnbd::new(chain)
}

/// The stream beside `place` (named `child`) that holds checkpoint
/// `parent` of `disk`.
fn find_parent<P: Place>(
    place: &P,
    child: &Path,
    disk: &str,
    parent: &str,
    opts: &OpenOptions,
) -> io::Result<(P, Arc<dyn Storage>)> {
    let (inc, full) = (
        format!("{disk}.inc.{parent}.data"),
        format!("{disk}.full.data"),
    );
    let (mut seen, mut absent) = (Vec::new(), Vec::new());
    for name in [inc.clone(), full.clone()] {
        // The names come from the stream's metadata: one naming another
        // directory names no stream beside it.
        if name.contains('/') {
            continue;
        }
        let Some((p, st)) = place.sibling(&name, opts)? else {
            absent.push(name);
            continue;
        };
        let shown = p.name();
        if !vnbd::probe_storage(&*st)? {
            seen.push(format!("'{}' is no virtnbdbackup stream", shown.display()));
            continue;
        }
        let m = vnbd::meta(&shown, &*st)?;
        if m.disk == disk && m.checkpoint == parent {
            return Ok((p, st));
        }
        seen.push(format!(
            "'{}' holds checkpoint '{}' of disk '{}'",
            shown.display(),
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
    // ENOENT, about the stream that is missing: the full one if it is
    // not there (every chain starts with it), else the parent's own name.
    let missing = match absent.contains(&full) || full.contains('/') {
        true => full,
        false => inc,
    };
    let missing = place.beside(&missing);
    let e = io::Error::from_raw_os_error(libc::ENOENT);
    Err(crate::with_file(e, msg, missing))
}
