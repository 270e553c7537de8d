//! DST classified once and opened: what kind it is, its lock, its size, a
//! file created for the run, an image served through a private qemu-nbd.

use super::{Error, Request};
use crate::guard;
use blkimage::QemuTarget;
use blkimage::nbd::Nbd;
use blkimage::{Extent, Source};
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Seek};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What DST is, as blksync writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A file to create.
    Missing,
    /// A regular file (raw; an image of another format becomes `Nbd` once
    /// served).
    File,
    /// A block device.
    Device,
    /// An NBD export (a URL, or an image file served by a private
    /// qemu-nbd).
    Nbd,
}

impl Kind {
    /// A regular file (or one to create): resized to SRC's size.
    pub fn is_file(self) -> bool {
        matches!(self, Kind::Missing | Kind::File)
    }
}

/// DST, opened for the run.
pub struct Dst {
    /// DST as given (a path, or the URL as a path).
    pub path: PathBuf,
    /// DST's name in messages.
    pub name: String,
    /// What DST is.
    pub kind: Kind,
    /// The connection DST is written through (an NBD URL or a served image).
    pub nbd: Option<Arc<Nbd>>,
    /// The private server of an image DST, and the image's format.
    pub served: Option<Served>,
    /// The file as it was before a server opened it (a served image's
    /// state is checked against it).
    pub file_meta: Option<Metadata>,
    /// DST read as raw bytes (a file or a device).
    pub read: Option<File>,
    /// DST's size now (0 for a file to create).
    pub size: u64,
    /// Held for the run: one run at a time writes DST.
    _lock: Option<guard::Lock>,
    /// Removed if the run fails before writing DST.
    created: Option<Created>,
}

/// A DST file that is an image of another format, served writable by a
/// private qemu-nbd.
pub struct Served {
    /// The image's format ("qcow2", ...).
    pub format: &'static str,
    /// The private qemu-nbd and its export.
    pub target: QemuTarget,
}

/// A DST this run created, removed when dropped (the run failed before
/// writing it).
struct Created(PathBuf);

impl Drop for Created {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Dst {
    /// Classify DST (connecting to an NBD URL) and lock it: one run at a
    /// time writes it, locked before it or its state is read.
    pub fn classify(req: &Request, wait: guard::Wait<'_>) -> Result<Dst, Error> {
        let name = blkimage::http::redact(&req.dst.to_string_lossy()).into_owned();
        if req.dst.to_str().is_some_and(blkimage::http::is_url) {
            return Err(Error::unusable(
                &name,
                "an HTTP(S) URL is read here, never written: DST must be a file, a block \
                 device or an NBD URL",
            ));
        }
        let nbd = match req.dst.to_str().is_some_and(blkimage::nbd::is_url) {
            true => Some(open_nbd(&name, &req.job.open.nbd)?),
            false => None,
        };
        let path = PathBuf::from(&req.dst);
        let kind = match std::fs::metadata(&path) {
            _ if nbd.is_some() => Kind::Nbd,
            Ok(m) if m.file_type().is_block_device() => Kind::Device,
            Ok(m) if m.is_file() => Kind::File,
            Ok(_) => {
                return Err(Error::unusable(
                    &name,
                    "not a regular file or block device (DST must be a raw file or a block device)",
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match blkimage::unknown_scheme(&req.dst) {
                    Some(e) => return Err(Error::io(&name, e)),
                    None => Kind::Missing,
                }
            }
            Err(e) => return Err(Error::io(&name, e)),
        };
        let lock = match kind {
            Kind::File | Kind::Device => {
                let f = File::open(&path).map_err(|e| Error::io(&name, e))?;
                Some(guard::lock(f, &name, wait).map_err(super::locked)?)
            }
            Kind::Missing | Kind::Nbd => None,
        };
        Ok(Dst {
            path,
            name,
            kind,
            nbd,
            served: None,
            file_meta: None,
            read: None,
            size: 0,
            _lock: lock,
            created: None,
        })
    }

    /// Make DST ready for SRC: a missing file created (by this run only,
    /// and locked; in `-O`'s format), an image of another format served,
    /// its format checked against `-O`, opened for reading, its size
    /// taken and checked against SRC's where it cannot change.
    pub fn prepare(
        &mut self,
        req: &Request,
        src: &dyn Source,
        wait: guard::Wait<'_>,
    ) -> Result<(), Error> {
        let size = src.size();
        let name = self.name.clone();
        let io = |e| Error::io(&name, e);
        if self.kind == Kind::Missing && !req.dry_run {
            self.create(req, size, wait)?;
        }
        if self.kind == Kind::File {
            self.file_meta = Some(std::fs::metadata(&self.path).map_err(io)?);
        }
        let image_format = match &self.file_meta {
            Some(meta) => image_format(&self.path, &name, req.job.open.no_backing, src, meta)?,
            None => None,
        };
        let have = match (image_format, self.kind) {
            (Some(f), _) => Some(f),
            (None, Kind::File | Kind::Device) => Some("raw"),
            // An export is what its server makes of it; nothing exists yet.
            (None, Kind::Nbd | Kind::Missing) => None,
        };
        if let (Some(have), Some(want)) = (have, req.output_format)
            && have != want.name()
        {
            return Err(Error::unusable(
                &name,
                format!("a {have} image, not {} (-O {})", want.name(), want.name()),
            ));
        }
        if let Some(format) = image_format {
            let target = QemuTarget::open(&self.path, format, &req.job.open.nbd).map_err(io)?;
            self.nbd = Some(target.nbd());
            self.served = Some(Served { format, target });
            self.kind = Kind::Nbd;
        }
        if matches!(self.kind, Kind::File | Kind::Device) {
            self.read = Some(File::open(&self.path).map_err(io)?);
        }
        self.size = match (&self.read, &self.nbd) {
            (_, Some(n)) => n.size(),
            (None, None) => 0,
            (Some(f), None) => (&*f).seek(io::SeekFrom::End(0)).map_err(io)?,
        };
        self.check_size(size)
    }

    /// Create the missing DST of SRC's `size`, by this run only, and lock
    /// it; in `-O`'s format.
    fn create(&mut self, req: &Request, size: u64, wait: guard::Wait<'_>) -> Result<(), Error> {
        let name = &self.name;
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Error::unusable(
                    name,
                    "created by another process while blksync started: rerun",
                ),
                _ => Error::io(name, e),
            })?;
        self.created = Some(Created(self.path.clone()));
        self._lock = Some(guard::lock(f, name, wait).map_err(super::locked)?);
        // A raw DST stays `Missing`: nothing to read, written from zero.
        if let Some(f) = req.output_format.filter(|&f| f != blkimage::Format::Raw) {
            create_image(self.path.as_os_str(), &self.name, f.name(), size)?;
            self.kind = Kind::File;
        }
        Ok(())
    }

    /// A DST whose size cannot change (not a file) must be SRC's `size`.
    fn check_size(&self, size: u64) -> Result<(), Error> {
        if self.kind.is_file() || self.size == size {
            return Ok(());
        }
        let what = match (self.kind, &self.served) {
            (_, Some(t)) => format!("a {} image", t.format),
            (Kind::Nbd, None) => "an NBD export".to_string(),
            _ => "a block device".to_string(),
        };
        let name = &self.name;
        let hint = match &self.served {
            Some(_) => format!(" (qemu-img resize {name} {size})"),
            None => String::new(),
        };
        Err(Error::unusable(
            name,
            format!(
                "{what} of {} bytes, SRC is {size}: sizes must match{hint}",
                self.size
            ),
        ))
    }

    /// The run is about to write DST: a file it created stays, whatever
    /// happens next (a failed run leaves it for the next).
    pub fn keep(&mut self) {
        std::mem::forget(self.created.take());
    }

    /// True if DST is known to read as zeros without reading it: a file
    /// to create, an empty file or one with no data allocated, an export
    /// whose block status says so.
    pub fn known_empty(&self) -> Result<bool, Error> {
        Ok(match (&self.read, self.kind) {
            (_, Kind::Nbd) => {
                let nbd = self.nbd.as_ref().expect("an NBD DST has its connection");
                reads_as_zeros(nbd).map_err(|e| Error::io(&self.name, e))?
            }
            (None, _) => true,
            (Some(f), Kind::File) => self.size == 0 || holds_no_data(f),
            _ => false,
        })
    }

    /// Open DST for writing.
    pub fn open_target(&self) -> Result<super::target::Target, Error> {
        use super::target::Target;
        match &self.nbd {
            Some(n) => Ok(Target::Nbd(n.clone())),
            None => OpenOptions::new()
                .write(true)
                .create(self.kind == Kind::Missing)
                .truncate(false)
                .open(&self.path)
                .map(Target::File)
                .map_err(|e| Error::io(&self.name, e)),
        }
    }
}

/// Connect to an NBD DST, which must take writes.
fn open_nbd(url: &str, opts: &blkimage::nbd::NbdOptions) -> Result<Arc<Nbd>, Error> {
    let nbd = blkimage::nbd::open_url(url, opts).map_err(|e| Error::io(url, e))?;
    if !nbd.is_writable() {
        return Err(Error::unusable(url, "the export is read-only"));
    }
    Ok(Arc::new(nbd))
}

/// True if the whole export reads as zeros, by its block status (never
/// read: an export without block status is not known to be empty).
fn reads_as_zeros(n: &Nbd) -> io::Result<bool> {
    if !n.has_block_status() {
        return Ok(false);
    }
    let mut pos = 0;
    while pos < n.size() {
        for e in n.extents(pos, n.size() - pos)? {
            if !e.kind.is_zero() {
                return Ok(false);
            }
            pos = e.end();
        }
    }
    Ok(true)
}

/// True if the file has no data allocated at all (reads as zeros).
fn holds_no_data(f: &File) -> bool {
    // SAFETY: lseek on an open descriptor.
    let rc = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
}

/// The format of a DST file that is an image of another format (qcow2,
/// vmdk...), to write through a private qemu-nbd, so that its guest
/// content becomes SRC's and its format stays (as `qemu-img convert -n`
/// writes into an image); `None` for a raw file. A raw file that starts as
/// SRC's guest content does (the copy of a disk that holds an image
/// itself) stays raw. A LUKS image is refused: its passphrase has no way
/// in here.
fn image_format(
    path: &Path,
    name: &str,
    no_backing: bool,
    src: &dyn Source,
    meta: &Metadata,
) -> Result<Option<&'static str>, Error> {
    let io = |e| Error::io(name, e);
    let size = meta.len();
    if size == 0 {
        return Ok(None);
    }
    let raw = blkimage::RawFile::open(path, false).map_err(io)?;
    let f = File::open(path).map_err(io)?;
    let format = if blkimage::qcow2::probe(&raw).map_err(io)? {
        Some("qcow2")
    } else {
        blkimage::probe_format(&f, size).map_err(io)?
    };
    let Some(format) = format else {
        return Ok(None);
    };
    let n = size.min(src.size()).min(512) as usize;
    let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
    if raw.read_at(&mut a, 0).is_ok() && src.read_at(&mut b, 0).is_ok() && a == b {
        return Ok(None);
    }
    if format == "luks" {
        return Err(Error::unusable(
            name,
            "a LUKS image: blksync cannot unlock it (serve it with qemu-nbd and its \
             passphrase, and give the export's URL as DST)",
        ));
    }
    // qemu-nbd follows an image's references to other files (an external
    // data file is written): --no-backing refuses them, as for SRC.
    if no_backing {
        if format != "qcow2" {
            return Err(Error::unusable(
                name,
                format!(
                    "a {format} image may refer to other files, which qemu-nbd would write; \
                     with --no-backing only qcow2 DSTs are taken (their references are checked)"
                ),
            ));
        }
        let opts = blkimage::OpenOptions {
            cache: true,
            format: Some(blkimage::Format::Qcow2),
            no_backing: true,
            ..Default::default()
        };
        blkimage::open(path, &opts).map_err(io)?;
    }
    Ok(Some(format))
}

/// Create DST, `size` bytes of zeros in `format`, with `qemu-img create`.
fn create_image(path: &OsStr, name: &str, format: &str, size: u64) -> Result<(), Error> {
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", format])
        .arg(path)
        .arg(size.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::unusable(
                name,
                format!(
                    "{format} images are created with qemu-img, which is not installed: \
                     install qemu-utils (Debian, Ubuntu) or qemu-img (Fedora, RHEL)"
                ),
            ),
            _ => Error::unusable(name, format!("cannot run qemu-img: {e}")),
        })?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(Error::unusable(
            name,
            format!("qemu-img create failed: {}", why.trim()),
        ));
    }
    Ok(())
}

/// The DST connection as an input to hash.
pub struct SharedNbd(pub Arc<Nbd>);

impl Source for SharedNbd {
    fn format(&self) -> &str {
        self.0.format()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.0.extents(offset, len)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
}
