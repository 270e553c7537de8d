//! Regular files and block devices, read with pread (direct I/O where it
//! was asked for), or in place from memory maps when read through the
//! page cache and asked to ([`crate::mapped`]). Holes are found with
//! SEEK_DATA/SEEK_HOLE and never read.
//!
//! A [`RawFile`] is read as a raw image (`crate::formats::raw`: QEMU's
//! size, the file's length rounded up to 512); an [`ImageFile`] is the
//! same file as a format's [`Storage`], its exact length.

use super::readpath::{Chooser, MIN_LEND, MapReads, Plan, Way, thread_cpu_nanos};
use super::{Storage, check_range};
use crate::source::{Extent, ExtentKind, Origin, Role};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// A raw file or block device.
pub struct RawFile {
    file: File,
    /// The name it was opened by (for [`crate::Source::origin`]).
    path: std::path::PathBuf,
    /// A second, buffered handle for reads direct I/O cannot do (unaligned
    /// ones, at the end of the file); `None` when `file` is buffered.
    buffered: Option<File>,
    file_size: u64,
    /// Block devices and file systems without SEEK_DATA are all data.
    seek_data: bool,
    is_block: bool,
    /// Whether lent ranges are mapped or copied ([`RawFile::map_reads`]).
    reads: Chooser,
}

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
            seek_data: !is_block,
            is_block,
            reads: Chooser::new(MapReads::Never),
        })
    }

    /// Lend ranges in place from memory maps ([`crate::Source::read_in_place`])
    /// if the file is read through the page cache (not with direct I/O),
    /// as `how` says: always ([`MapReads::Always`]), or where that is
    /// measured to cost less than copies ([`MapReads::Auto`], see
    /// [`MapReads`]). A mapped range is digested where the cached pages
    /// are, without a copy. Installs the process's SIGBUS handler
    /// ([`crate::mapped::install`]), which turns a file that shrinks under
    /// a map into an error.
    ///
    /// Not under an address-space limit (`ulimit -v`): each lend maps
    /// address space of its own and unmaps it when digested, so the room
    /// left rises and falls, and at the moment a lend holds it an
    /// allocation elsewhere that cannot fail cleanly (a small one) may
    /// find none: at 20 MB, 24 runs of 40 aborted. Reads are then copied
    /// into buffers each worker allocates once.
    pub fn map_reads(&mut self, how: MapReads) -> io::Result<()> {
        if how != MapReads::Never && !self.is_direct() && !blkhash::address_space_limited() {
            crate::storage::mapped::install()?;
            self.reads = Chooser::new(how);
        }
        Ok(())
    }

    /// Bytes lent from memory maps so far (the rest of the data was copied).
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.reads.mapped_bytes()
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

    /// The file's own length in bytes (a block device's size).
    pub(crate) fn file_size(&self) -> u64 {
        self.file_size
    }

    /// Fill `buf` from `offset`, every byte inside the file: with direct
    /// I/O where it is aligned, else through the page cache.
    pub(crate) fn read_bytes(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(buffered) = &self.buffered {
            let aligned = |n: usize| n.is_multiple_of(crate::buffer::ALIGN);
            if aligned(offset as usize) && aligned(buf.len()) && aligned(buf.as_ptr() as usize) {
                match Self::pread_full(&self.file, buf, offset) {
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    r => return r,
                }
            }
            return Self::pread_full(buffered, buf, offset);
        }
        Self::pread_full(&self.file, buf, offset)
    }

    /// How many of the `len` bytes from `offset` are lent in place from a
    /// memory map (or copied by the worker that digests them, while the
    /// choice measures both ways): all of them, or none (not mapped, too
    /// few to be worth a map, not all inside the file, or copied as a
    /// plain read: [`Chooser::plan`]). Asked once per range, in order.
    pub(crate) fn lendable_bytes(&self, offset: u64, len: usize) -> usize {
        let in_file = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.file_size);
        if !self.reads.maps() || len < MIN_LEND || !in_file {
            return 0;
        }
        match self.reads.plan(offset) {
            Plan::Lend(_) => len,
            Plan::Read => 0,
        }
    }

    /// Call `f` with the `len` bytes from `offset`: from a memory map, or
    /// copied, as [`RawFile::map_reads`] chose; the CPU time of either
    /// (reading and digesting) measured for the choice when it asks.
    pub(crate) fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        if !self.reads.maps() {
            return crate::source::copy_to(len, |buf| self.read_bytes(buf, offset), f);
        }
        let (way, measure) = (self.reads.take(offset), self.reads.measures());
        match way {
            Way::Mapped => {
                let start = if measure { thread_cpu_nanos() } else { 0 };
                crate::storage::mapped::with_map(&self.file, offset, len, f)?;
                self.reads.lent_mapped(len);
                if measure {
                    self.reads
                        .record(way, thread_cpu_nanos().saturating_sub(start), len);
                }
                Ok(())
            }
            // The buffer is this thread's, had before the clock starts:
            // its first allocation is no lend's cost.
            Way::Copied => super::readpath::with_buffer(len, |buf| {
                let start = if measure { thread_cpu_nanos() } else { 0 };
                self.read_bytes(buf, offset)?;
                f(buf);
                if measure {
                    self.reads
                        .record(way, thread_cpu_nanos().saturating_sub(start), len);
                }
                Ok(())
            }),
        }
    }

    /// An error if the file is shorter now than when it was opened.
    pub(crate) fn check_shrunk(&self) -> io::Result<()> {
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

    /// The extent from `offset` (before `end`): a hole or data, as
    /// SEEK_DATA and SEEK_HOLE say; past the file's end, the rounding's
    /// zeros, a hole.
    pub(crate) fn next_extent(&self, offset: u64, end: u64) -> io::Result<Extent> {
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

impl RawFile {
    /// Where its bytes come from: the file, as the image's own.
    pub(crate) fn origin(&self) -> Vec<Origin> {
        vec![Origin::File {
            path: self.path.clone(),
            role: Role::Image,
        }]
    }
}

/// A raw file or block device (with direct I/O where it was asked for),
/// with its exact length: reads past it are errors (a qcow2 file need not
/// end on a 512-byte boundary, as a raw image's size rounds to).
pub struct ImageFile {
    raw: RawFile,
    len: u64,
    /// Fewer blocks allocated than its length: it has holes worth asking
    /// for (a file with none answers every question with data: no call).
    sparse: bool,
}

impl ImageFile {
    /// `raw`, opened from `path`.
    pub fn new(raw: RawFile, path: &std::path::Path) -> io::Result<ImageFile> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        // The size a raw image of it has (rounded up to 512), as QEMU sees it.
        let size = raw.file_size().next_multiple_of(512);
        let len = if meta.is_file() {
            meta.len().min(size)
        } else {
            size
        };
        let sparse = meta.is_file() && meta.blocks().saturating_mul(512) < meta.len();
        Ok(ImageFile { raw, len, sparse })
    }
}

impl Storage for ImageFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        self.raw.read_bytes(buf, offset)
    }

    fn finish(&self) -> io::Result<()> {
        self.raw.check_shrunk()
    }

    fn is_direct(&self) -> bool {
        self.raw.is_direct()
    }

    fn lendable(&self, offset: u64, len: usize) -> usize {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => self.raw.lendable_bytes(offset, len),
            _ => 0,
        }
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        check_range(offset, len, self.len)?;
        self.raw.lend(offset, len, f)
    }

    fn mapped_bytes(&self) -> u64 {
        self.raw.mapped_bytes()
    }

    fn origin(&self) -> Vec<Origin> {
        self.raw.origin()
    }

    fn data_at(&self, offset: u64, len: u64) -> io::Result<(bool, u64)> {
        let len = len.min(self.len.saturating_sub(offset));
        if !self.sparse || len == 0 {
            return Ok((true, len.max(1)));
        }
        match self.raw.next_extent(offset, offset + len) {
            Ok(e) if e.offset == offset && e.len > 0 => Ok((!e.kind.is_zero(), e.len)),
            Ok(_) => Ok((true, len)),
            Err(e) => Err(e),
        }
    }
}
