//! Raw images: regular files and block devices, read with pread, or in
//! place from memory maps when read through the page cache and asked to
//! ([`crate::mapped`]).
//!
//! Holes are found with SEEK_DATA/SEEK_HOLE and never read. The size is
//! QEMU's: a file's length rounded up to a multiple of 512, the tail reading
//! as zeros, so that a raw file and its conversion to any format agree.

use crate::source::{Extent, ExtentKind, Source};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// A raw file or block device.
pub struct RawFile {
    file: File,
    /// The name it was opened by (for [`Source::files`]).
    path: std::path::PathBuf,
    /// A second, buffered handle for reads direct I/O cannot do (unaligned
    /// ones, at the end of the file); `None` when `file` is buffered.
    buffered: Option<File>,
    file_size: u64,
    size: u64,
    /// Block devices and file systems without SEEK_DATA are all data.
    seek_data: bool,
    is_block: bool,
    /// Ranges are lent in place from memory maps ([`RawFile::map_reads`]).
    mapped: bool,
}

/// The least a raw file lends from a map: below it a copy costs less than
/// mapping, filling the page tables and unmapping.
const MIN_LEND: usize = 256 << 10;

/// The magic number of the file system `fd` lives on (`statfs`'s `f_type`).
pub(crate) fn fs_type(fd: &impl AsRawFd) -> io::Result<i64> {
    // SAFETY: fstatfs fills the zeroed struct on a valid descriptor.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

fn lseek(file: &File, offset: u64, whence: i32) -> io::Result<u64> {
    // SAFETY: plain syscall on a valid descriptor.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// An `F_OFD_SETLK` or `F_OFD_GETLK` of `kind` on the single byte `byte`:
/// the lock type found (`F_UNLCK` if none) for `F_OFD_GETLK`.
fn ofd_lock(file: &File, cmd: i32, kind: i32, byte: u64) -> io::Result<i32> {
    // SAFETY: a zeroed flock is valid (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    loop {
        // SAFETY: fcntl on a valid descriptor with a valid flock.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
        if r == 0 {
            return Ok(i32::from(fl.l_type));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The file system (or the kernel) has no OFD locks.
fn no_locks(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::EINVAL)
    )
}

fn in_use(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "in use: {what} (another process, such as a VM or a writable qemu-nbd, \
             has the image open)"
        ),
    )
}

impl RawFile {
    /// Open `path` read-only; with `direct`, bypass the page cache where the
    /// file system allows it (else fall back to the cache, as QEMU does).
    pub fn open(path: &Path, direct: bool) -> io::Result<RawFile> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        let ft = meta.file_type();
        if ft.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        let is_block = ft.is_block_device();
        if !is_block && !ft.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        }
        let file_size = if is_block {
            lseek(&file, 0, libc::SEEK_END)?
        } else {
            meta.len()
        };
        let (file, buffered) = if direct {
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(d) => (d, Some(file)),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (file, None),
                Err(e) => return Err(e),
            }
        } else {
            (file, None)
        };
        if buffered.is_none() {
            // SAFETY: advisory syscall on a valid descriptor.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
        }
        Ok(RawFile {
            file,
            path: path.to_path_buf(),
            buffered,
            file_size,
            size: file_size.next_multiple_of(512),
            seek_data: !is_block,
            is_block,
            mapped: false,
        })
    }

    /// [`RawFile::open`] as `opts` ask: direct I/O unless `opts.cache`,
    /// and read from memory maps if `opts.map` (see [`RawFile::map_reads`]).
    pub fn open_with(path: &Path, opts: &crate::OpenOptions) -> io::Result<RawFile> {
        let mut file = RawFile::open(path, !opts.cache)?;
        if opts.map {
            file.map_reads()?;
        }
        Ok(file)
    }

    /// Lend ranges in place from memory maps ([`Source::read_in_place`])
    /// if the file is read through the page cache (not with direct I/O):
    /// the digest workers read the cached pages without a copy. Installs
    /// the process's SIGBUS handler ([`crate::mapped::install`]), which
    /// turns a file that shrinks under a map into an error.
    pub fn map_reads(&mut self) -> io::Result<()> {
        if !self.is_direct() {
            crate::mapped::install()?;
            self.mapped = true;
        }
        Ok(())
    }

    /// Take QEMU's image locks as `qemu-img convert` does, for as long as
    /// this file is open; an error if another process's locks forbid it.
    ///
    /// QEMU (its file-posix driver, files and host devices alike) locks
    /// single bytes with shared open-file-description locks: byte 100 + p
    /// while it holds permission p, byte 200 + p while it does not let
    /// others hold p (p: 0 consistent read, 1 write, 2 write unchanged, 3
    /// resize). A reader holds "consistent read" and shares neither "write"
    /// nor "resize": bytes 100, 201 and 203. Then it fails if another
    /// process holds byte 200 (someone forbids consistent reads), 101 (a
    /// writer: a running VM, a writable qemu-nbd) or 103 (a resizer), with
    /// QEMU's words. `force_share` (qemu-img's `-U`) takes only byte 100
    /// and checks only byte 200. Locks are taken before they are checked,
    /// so of two processes starting together at least one sees the other.
    ///
    /// On a file system without these locks (the calls fail with ENOLCK,
    /// EOPNOTSUPP or EINVAL) no QEMU can hold them either: the file is
    /// read without them.
    ///
    /// ```no_run
    /// let f = blkimage::RawFile::open(std::path::Path::new("disk.img"), true).unwrap();
    /// // Fails with "in use" while a VM has disk.img open for writing.
    /// f.lock(false).unwrap();
    /// ```
    pub fn lock(&self, force_share: bool) -> io::Result<()> {
        const CONSISTENT_READ: u64 = 0;
        const WRITE: u64 = 1;
        const RESIZE: u64 = 3;
        let names = |p| match p {
            CONSISTENT_READ => "consistent read",
            WRITE => "write",
            _ => "resize",
        };
        let unshared: &[u64] = if force_share { &[] } else { &[WRITE, RESIZE] };
        let mut held = vec![100 + CONSISTENT_READ];
        held.extend(unshared.iter().map(|p| 200 + p));
        for &byte in &held {
            match ofd_lock(&self.file, libc::F_OFD_SETLK, libc::F_RDLCK, byte) {
                Ok(_) => {}
                Err(e) if no_locks(&e) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    // Only an exclusive lock conflicts with ours: QEMU takes
                    // none, but say what it is.
                    return Err(in_use(format!("cannot lock byte {byte}")));
                }
                Err(e) => return Err(e),
            }
        }
        let mut tests = vec![(
            200 + CONSISTENT_READ,
            format!("Failed to get \"{}\" lock", names(CONSISTENT_READ)),
        )];
        tests.extend(unshared.iter().map(|&p| {
            (
                100 + p,
                format!("Failed to get shared \"{}\" lock", names(p)),
            )
        }));
        for (byte, what) in tests {
            match ofd_lock(&self.file, libc::F_OFD_GETLK, libc::F_WRLCK, byte) {
                Ok(libc::F_UNLCK) => {}
                Ok(_) => return Err(in_use(what)),
                Err(e) if no_locks(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The magic number of the file system the file lives on (`statfs`'s
    /// `f_type`).
    pub fn fs_type(&self) -> io::Result<i64> {
        fs_type(&self.file)
    }

    /// True if reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.buffered.is_some()
    }

    fn pread_full(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match file.read_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the file shrank while it was read (it ended at offset {offset})"),
                    ));
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn next_extent(&self, offset: u64, end: u64) -> io::Result<Extent> {
        let extent = |end: u64, kind| Extent {
            offset,
            len: end - offset,
            kind,
        };
        if offset >= self.file_size {
            // QEMU's rounding up to 512: reads as zeros.
            return Ok(extent(end, ExtentKind::Hole));
        }
        let file_end = end.min(self.file_size);
        if !self.seek_data {
            return Ok(extent(file_end, ExtentKind::Data));
        }
        match lseek(&self.file, offset, libc::SEEK_DATA) {
            Ok(data) if data > offset => Ok(extent(data.min(file_end), ExtentKind::Hole)),
            Ok(_) => {
                let hole = lseek(&self.file, offset, libc::SEEK_HOLE)?;
                Ok(extent(hole.clamp(offset + 1, file_end), ExtentKind::Data))
            }
            // No data from here to the end of the file.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                Ok(extent(file_end, ExtentKind::Hole))
            }
            // The file system cannot tell: read everything.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                Ok(extent(file_end, ExtentKind::Data))
            }
            Err(e) => Err(e),
        }
    }
}

impl Source for RawFile {
    fn format(&self) -> &str {
        "raw"
    }

    fn files(&self) -> Vec<std::path::PathBuf> {
        vec![self.path.clone()]
    }

    fn is_direct(&self) -> bool {
        RawFile::is_direct(self)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn rounded(&self) -> Option<crate::Rounded> {
        (self.size != self.file_size).then_some(crate::Rounded {
            file_size: self.file_size,
            size: self.size,
        })
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(vec![self.next_extent(offset, offset + len)?])
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let in_file = (self.file_size.saturating_sub(offset) as usize).min(buf.len());
        let (head, tail) = buf.split_at_mut(in_file);
        tail.fill(0);
        if head.is_empty() {
            return Ok(());
        }
        if let Some(buffered) = &self.buffered {
            let aligned = |n: usize| n.is_multiple_of(crate::buffer::ALIGN);
            if aligned(offset as usize) && aligned(head.len()) && aligned(head.as_ptr() as usize) {
                match Self::pread_full(&self.file, head, offset) {
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    r => return r,
                }
            }
            return Self::pread_full(buffered, head, offset);
        }
        Self::pread_full(&self.file, head, offset)
    }

    fn lendable(&self, offset: u64, len: usize) -> usize {
        let in_file = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.file_size);
        if self.mapped && len >= MIN_LEND && in_file {
            len
        } else {
            0
        }
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        if !self.mapped {
            let mut buf = vec![0u8; len];
            self.read_at(&mut buf, offset)?;
            f(&buf);
            return Ok(());
        }
        crate::mapped::with_map(&self.file, offset, len, f)
    }

    fn finish(&self) -> io::Result<()> {
        if self.is_block {
            return Ok(());
        }
        let now = self.file.metadata()?.len();
        if now < self.file_size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the file shrank while it was read (from {} to {now} bytes)",
                    self.file_size
                ),
            ));
        }
        Ok(())
    }
}
