//! Opening a qcow2 file with what it refers to: its external data file and
//! its backing chain (qcow2 or raw images, to a bounded depth, without loops).

use super::{Format, OpenOptions};
use crate::formats::qcow2::{Header, MAX_CHAIN_DEPTH, Qcow2, invalid, probe, unsupported};
use crate::source::Source;
use crate::storage::http::{Http, HttpOptions, HttpUrl};
use crate::storage::{ImageFile, RawFile, Storage};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `name` (from the image at `base`) as a path: relative names resolve
/// against the directory of `base`, as QEMU does.
fn resolve(base: &Path, name: &[u8]) -> PathBuf {
    let name = Path::new(OsStr::from_bytes(name));
    if name.is_absolute() {
        name.to_path_buf()
    } else {
        base.parent().unwrap_or(Path::new("")).join(name)
    }
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// File systems whose "regular files" are not stored bytes: their sizes
/// say nothing of their content (`/proc/self/mem` is 0 bytes long and
/// reads a process's memory). An image names one only by mistake or to
/// attack, and QEMU would read it as a size-0 (all zeros) image: refused.
const PSEUDO_FILE_SYSTEMS: &[(i64, &str)] = &[
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0xcafe_4a11, "bpf"),
    (0x6265_6570, "configfs"),
    (0xde5e_81e4, "efivarfs"),
    (0x6165_676c, "pstore"),
];

/// The name of the pseudo file system (one of [`PSEUDO_FILE_SYSTEMS`])
/// `file` lives on, if it does.
pub(crate) fn pseudo_file_system(
    file: &impl std::os::fd::AsRawFd,
) -> io::Result<Option<&'static str>> {
    let kind = crate::storage::file::fs_type(file)?;
    Ok(PSEUDO_FILE_SYSTEMS
        .iter()
        .find(|(t, _)| *t == kind)
        .map(|(_, name)| *name))
}

/// An error if `file` lives on one of [`PSEUDO_FILE_SYSTEMS`].
fn refuse_pseudo_file(file: &RawFile) -> io::Result<()> {
    let kind = file.fs_type()?;
    match PSEUDO_FILE_SYSTEMS
        .iter()
        .find(|(t, _)| *t == kind)
        .map(|(_, n)| n)
    {
        Some(name) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a {name} file, not a disk image"),
        )),
        None => Ok(()),
    }
}

/// Open the qcow2 image in `file` (at `path`, already probed) with its data
/// file and backing chain. `chain` holds the canonical paths of the images
/// above it, for loop detection and the depth limit.
pub(crate) fn open_file(
    file: RawFile,
    path: &Path,
    opts: &OpenOptions,
    chain: &mut Vec<PathBuf>,
) -> io::Result<Qcow2> {
    open_file_over(file, path, opts, chain, None)
}

/// [`open_file`], over `below` if given (an image of a chain the user
/// named: [`open_named_chain`]) instead of a backing file, which the image
/// must then not name.
fn open_file_over(
    file: RawFile,
    path: &Path,
    opts: &OpenOptions,
    chain: &mut Vec<PathBuf>,
    below: Option<Box<dyn Source>>,
) -> io::Result<Qcow2> {
    let file: Arc<dyn Storage> = Arc::new(ImageFile::new(file, path)?);
    let header = Header::parse(&*file)?;
    if let (Some(name), Some(_)) = (&header.backing_file, &below) {
        return Err(unsupported(format!(
            "the image has the backing file '{}': --chain takes images without one \
             (qemu-img rebase -u would replace it; name it in the chain instead)",
            show(name)
        )));
    }
    let (data_name, backing_name) = referred(&header, opts)?;

    let data: Option<Arc<dyn Storage>> = if let Some(name) = data_name {
        let p = resolve(path, name);
        let ctx = |e: io::Error| {
            let msg = format!("qcow2: external data file '{}': {e}", p.display());
            crate::with_file(e, msg, &p)
        };
        let ft = std::fs::metadata(&p).map_err(ctx)?.file_type();
        if !(ft.is_file() || ft.is_block_device()) {
            return Err(ctx(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            )));
        }
        let raw = RawFile::open_with(&p, opts).map_err(ctx)?;
        refuse_pseudo_file(&raw).map_err(ctx)?;
        raw.lock(opts.force_share).map_err(ctx)?;
        Some(Arc::new(ImageFile::new(raw, &p).map_err(ctx)?))
    } else {
        None
    };

    let backing = match backing_name {
        None => below,
        Some(name) => Some(open_backing(
            &resolve(path, name),
            header.backing_format.as_deref(),
            opts,
            chain,
        )?),
    };
    Qcow2::new(header, file, data, backing)
}

/// The images at `paths`, oldest first, each read over the one before as
/// its backing image, as if they had been chained with `qemu-img rebase
/// -u` (the disk as of the last: KubeVirt's backups, each a standalone
/// qcow2 file). The first is opened as any image (`open_base`: its format
/// probed or forced, its own chain with it); every later one must be a
/// qcow2 image that names no backing file. Virtual sizes may differ, as
/// QEMU allows: the image's size is the last one's, and what an image
/// reads of one below past that one's end is zeros. An error names the
/// file: one missing, named twice (a loop), not a qcow2 image.
pub(crate) fn open_named_chain(
    paths: &[&Path],
    opts: &OpenOptions,
    open_base: impl FnOnce(&Path) -> io::Result<Box<dyn Source>>,
) -> io::Result<Box<dyn Source>> {
    if paths.len() > MAX_CHAIN_DEPTH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a chain of {} images, more than {MAX_CHAIN_DEPTH}",
                paths.len()
            ),
        ));
    }
    let ctx = |p: &Path| {
        let shown = p.display().to_string();
        move |e: io::Error| io::Error::new(e.kind(), format!("'{shown}': {e}"))
    };
    let mut seen: Vec<PathBuf> = Vec::with_capacity(paths.len());
    for p in paths {
        let canon = std::fs::canonicalize(p).map_err(ctx(p))?;
        if let Some(i) = seen.iter().position(|c| *c == canon) {
            let also = match paths[i] == *p {
                true => String::new(),
                false => format!(" (as '{}' too)", paths[i].display()),
            };
            return Err(ctx(p)(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("named twice in the chain{also}: a chain of images loops"),
            )));
        }
        seen.push(canon);
    }
    let (first, rest) = paths.split_first().expect("a chain names images");
    let mut image = open_base(first).map_err(ctx(first))?;
    for (i, p) in rest.iter().enumerate() {
        image = Box::new(open_overlay(p, opts, &seen[..i + 2], image).map_err(ctx(p))?);
    }
    Ok(image)
}

/// The qcow2 image at `path`, an image of a chain the user named, over
/// `below`; `chain`: the canonical paths of the chain's images up to this
/// one.
fn open_overlay(
    path: &Path,
    opts: &OpenOptions,
    chain: &[PathBuf],
    below: Box<dyn Source>,
) -> io::Result<Qcow2> {
    let ft = std::fs::metadata(path)?.file_type();
    if !(ft.is_file() || ft.is_block_device()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file or block device",
        ));
    }
    let file = RawFile::open_with(path, opts)?;
    refuse_pseudo_file(&file)?;
    file.lock(opts.force_share)?;
    if !probe(&file)? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a qcow2 image (the images of a chain after the first are qcow2)",
        ));
    }
    let mut chain = chain.to_vec();
    open_file_over(file, path, opts, &mut chain, Some(below))
}

/// The names an image gives its external data file and its backing file.
type Referred<'h> = (Option<&'h [u8]>, Option<&'h [u8]>);

/// The names of the files `header` refers to, its external data file and
/// its backing file, both refused with `opts.no_backing`.
fn referred<'h>(header: &'h Header, opts: &OpenOptions) -> io::Result<Referred<'h>> {
    let data = if header.external_data {
        let name = header
            .data_file
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| invalid("external data file bit set, but no data file named".into()))?;
        if opts.no_backing {
            return Err(unsupported(format!(
                "the image uses the external data file '{}' (files an image refers to are refused)",
                show(name)
            )));
        }
        Some(name)
    } else {
        None
    };
    let backing = header.backing_file.as_deref();
    if let Some(name) = backing.filter(|_| opts.no_backing) {
        return Err(unsupported(format!(
            "the image has the backing file '{}' (backing files are refused)",
            show(name)
        )));
    }
    Ok((data, backing))
}

/// An error if opening `key` (shown as `shown`) below the images of
/// `chain` would loop or pass [`MAX_CHAIN_DEPTH`].
fn check_chain<K: PartialEq>(
    chain: &[K],
    key: &K,
    shown: &dyn std::fmt::Display,
) -> io::Result<()> {
    if chain.contains(key) {
        return Err(invalid(format!(
            "backing chain loops: '{shown}' is its own backing file"
        )));
    }
    if chain.len() >= MAX_CHAIN_DEPTH {
        return Err(invalid(format!(
            "backing chain deeper than {MAX_CHAIN_DEPTH} images"
        )));
    }
    Ok(())
}

fn open_backing(
    path: &Path,
    format: Option<&str>,
    opts: &OpenOptions,
    chain: &mut Vec<PathBuf>,
) -> io::Result<Box<dyn Source>> {
    let ctx = |e: io::Error| {
        let msg = format!("qcow2: backing file '{}': {e}", path.display());
        crate::with_file(e, msg, path)
    };
    let canon = std::fs::canonicalize(path).map_err(ctx)?;
    let ft = std::fs::metadata(&canon).map_err(ctx)?.file_type();
    if ft.is_dir() {
        return Err(ctx(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a directory",
        )));
    }
    if !(ft.is_file() || ft.is_block_device()) {
        return Err(ctx(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file or block device",
        )));
    }
    check_chain(chain, &canon, &canon.display())?;
    let format = backing_format(format).map_err(ctx)?;
    let file = RawFile::open_with(path, opts).map_err(ctx)?;
    refuse_pseudo_file(&file).map_err(ctx)?;
    file.lock(opts.force_share).map_err(ctx)?;
    let is_qcow2 = match format {
        Some(Format::Raw) => false,
        _ => probe(&file)?,
    };
    if !is_qcow2 {
        if format == Some(Format::Qcow2) {
            return Err(ctx(invalid("not a qcow2 image".into())));
        }
        return Ok(Box::new(file));
    }
    chain.push(canon);
    let image = open_file(file, path, opts, chain);
    chain.pop();
    Ok(Box::new(image?))
}

/// The qcow2 image in `file`, a file over HTTP(S) (already probed), with
/// its data file and backing chain, each named relative to its URL
/// ([`HttpUrl::sibling`]: a remote image never names a file
/// of this host). `chain` holds the recorded URLs of the images above it,
/// for loop detection and the depth limit.
pub(crate) fn open_remote(
    file: Arc<Http>,
    opts: &OpenOptions,
    chain: &mut Vec<String>,
) -> io::Result<Qcow2> {
    let header = Header::parse(&*file)?;
    let (data_name, backing_name) = referred(&header, opts)?;
    let url = file.url().clone();
    let named = |what: &str, name: &[u8]| {
        url.sibling(name)
            .map_err(|e| unsupported(format!("{what} {e}")))
    };
    let data: Option<Arc<dyn Storage>> = if let Some(name) = data_name {
        let u = named("external data file", name)?;
        Some(Arc::new(open_below(
            &u,
            &opts.http,
            "qcow2: external data file",
        )?))
    } else {
        None
    };
    let backing = match backing_name {
        None => None,
        Some(name) => Some(open_remote_backing(
            &named("backing file", name)?,
            header.backing_format.as_deref(),
            opts,
            chain,
        )?),
    };
    Qcow2::new(header, file, data, backing)
}

fn open_remote_backing(
    url: &HttpUrl,
    format: Option<&str>,
    opts: &OpenOptions,
    chain: &mut Vec<String>,
) -> io::Result<Box<dyn Source>> {
    let key = url.recorded();
    check_chain(chain, &key, &url.shown())?;
    let format = backing_format(format).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("qcow2: backing file '{}': {e}", url.shown()),
        )
    })?;
    let http = open_below(url, &opts.http, "qcow2: backing file")?;
    let is_qcow2 = match format {
        Some(Format::Raw) => false,
        _ => is_qcow2(&http),
    };
    if !is_qcow2 {
        if format == Some(Format::Qcow2) {
            return Err(invalid(format!(
                "backing file '{}': not a qcow2 image",
                url.shown()
            )));
        }
        return Ok(Box::new(http));
    }
    chain.push(key);
    let image = open_remote(Arc::new(http), opts, chain);
    chain.pop();
    Ok(Box::new(image?))
}

/// A backing format a qcow2 header names: raw or qcow2 (or none: probed).
fn backing_format(format: Option<&str>) -> io::Result<Option<Format>> {
    match format {
        None => Ok(None),
        Some("qcow2") => Ok(Some(Format::Qcow2)),
        Some("raw") => Ok(Some(Format::Raw)),
        Some(f) => Err(unsupported(format!(
            "backing format '{f}' is not supported (qcow2 or raw)"
        ))),
    }
}

/// Open `url`, a file a remote image names (`what`: "backing file"...),
/// with ranges, its errors named as that file's.
fn open_below(url: &HttpUrl, opts: &HttpOptions, what: &str) -> io::Result<Http> {
    let ctx = format!("{what} '{}'", url.shown());
    let mut http = Http::open(url, opts).map_err(|e| {
        let msg = format!("{ctx}: {e}");
        crate::with_file(e, msg, url.shown())
    })?;
    http.set_context(ctx);
    Ok(http)
}

/// Whether `http` starts with a qcow2 header, from the bytes it holds.
fn is_qcow2(http: &Http) -> bool {
    crate::formats::qcow2::probe_bytes(&http.head()[..http.head().len().min(8)])
}
