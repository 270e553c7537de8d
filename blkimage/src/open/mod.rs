//! Opening an input: a name (a path, a URL, `-`) becomes an [`Input`], an
//! image ([`Source`]) or a stream. The top layer of the crate: the format
//! probed from the first bytes (or forced), the chain an image names found
//! (beside a file, relative to a URL: [`chain`]) and each part opened on
//! its storage, then handed to its format.

mod chain;
mod compressed;
mod http;
pub(crate) mod pbs;
mod vnbd;

use crate::formats::qcow2;
use crate::formats::qemu::{self, QemuExport};
use crate::source::{Origin, Role, Rounded, Source};
use crate::storage::MapReads;
use crate::storage::compressed::{Compression, PROBE_LEN, read_head};
use crate::storage::file::RawFile;
use crate::storage::nbd;
use crate::window::Window;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// An image format, to force instead of probing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The file's bytes as they are, whatever they hold.
    Raw,
    /// qcow2 (versions 2 and 3); an error if the file is not qcow2.
    Qcow2,
    /// Another format QEMU reads (a name from [`QEMU_FORMATS`](crate::QEMU_FORMATS)):
    /// served by a private qemu-nbd and read over NBD.
    Qemu(&'static str),
    /// A virtnbdbackup stream (`DISK.full.data`, `DISK.inc.*.data`): the
    /// disk it holds, with the earlier streams an incremental one needs;
    /// an error if the file is not one.
    Virtnbdbackup,
}

impl Format {
    /// The name QEMU (and `-f`) knows it by.
    ///
    /// ```
    /// let f: blkimage::Format = "vmdk".parse().unwrap();
    /// assert_eq!(f.name(), "vmdk");
    /// assert_eq!(blkimage::Format::Qcow2.name(), "qcow2");
    /// let f: blkimage::Format = "virtnbdbackup".parse().unwrap();
    /// assert_eq!(f, blkimage::Format::Virtnbdbackup);
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
            Format::Qemu(name) => name,
            Format::Virtnbdbackup => "virtnbdbackup",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "raw" => Ok(Format::Raw),
            "qcow2" => Ok(Format::Qcow2),
            "virtnbdbackup" => Ok(Format::Virtnbdbackup),
            _ => match qemu::FORMATS.iter().find(|f| **f == s) {
                Some(f) => Ok(Format::Qemu(f)),
                None => Err(format!(
                    "unknown format '{s}' (raw, qcow2, virtnbdbackup, {})",
                    qemu::FORMATS.join(", ")
                )),
            },
        }
    }
}

/// How to open inputs.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Use the page cache (else direct I/O where the file system allows it).
    pub cache: bool,
    /// Whether files read through the page cache (with `cache`, or on a
    /// file system without direct I/O) are read in place from memory maps
    /// (see [`crate::mapped`]): never (the default), where measured to cost
    /// less than copies, or always ([`MapReads`]). Maps install a
    /// process-wide SIGBUS handler the first time: for programs that own
    /// their signals (the commands); a library inside a host program leaves
    /// it [`MapReads::Never`].
    pub map: MapReads,
    /// The format; `None` probes the content (qcow2 magic and version 2 or
    /// later: qcow2; else raw).
    pub format: Option<Format>,
    /// Refuse images that refer to other files: a qcow2 backing file or
    /// external data file (an untrusted image can name any host file).
    pub no_backing: bool,
    /// The file with the passphrase of LUKS images (its bytes as they
    /// are), or of a PBS key file (its first line).
    pub secret_file: Option<std::path::PathBuf>,
    /// A Proxmox Backup Server key file (as `proxmox-backup-client key
    /// create` writes it): the key of an encrypted backup read from its
    /// datastore. Its passphrase, if it has one, comes from
    /// `PBS_ENCRYPTION_PASSWORD`, else `secret_file`.
    pub keyfile: Option<std::path::PathBuf>,
    /// Ignore QEMU's image locks (qemu-img's `-U`/`--force-share`): read an
    /// image even while a VM or a writable qemu-nbd has it open. Without
    /// it such an image is an error ([`io::ErrorKind::ResourceBusy`],
    /// "in use"), and while it is read the same shared lock QEMU's readers
    /// take keeps writers from opening it (see [`RawFile::lock`]).
    pub force_share: bool,
    /// NBD connections: timeout, connections, TLS certificates.
    pub nbd: nbd::NbdOptions,
    /// HTTP(S) requests: timeout, TLS certificates, headers, retries.
    pub http: crate::storage::http::HttpOptions,
    /// The caller needs random access (blksync's SRC): a compressed raw
    /// image is decompressed into a temporary file, as a compressed qcow2
    /// image always is, instead of being read as a stream.
    pub random_access: bool,
    /// A name with commas is a chain of image files, oldest first, each
    /// read over the one before (see [`open`]).
    pub chain: bool,
    /// Only the first `size` bytes of the image, as an image of that size
    /// (QEMU's raw `size` option): a block device larger than the image
    /// written to it. An image or stream shorter is an error.
    pub size: Option<u64>,
    /// A raw image is its bytes at their exact size (a file's length, a
    /// URL's), not rounded up to a multiple of 512 as QEMU rounds it (see
    /// [`Source::rounded`]): how oVirt imageio's file backend and Proxmox's
    /// backup client read a file. blkjob sets it from the construction.
    pub exact_size: bool,
}

/// An opened input.
pub enum Input {
    /// Random access, with a size and a map of its extents.
    Image(Box<dyn Source>),
    /// Read once from start to end (a pipe, standard input, a FIFO).
    Stream(Box<dyn Read + Send>),
}

impl Input {
    /// The guest size of an image; None for a stream (known at its end).
    pub fn size(&self) -> Option<u64> {
        match self {
            Input::Image(s) => Some(s.size()),
            Input::Stream(_) => None,
        }
    }

    /// The file's size, if the guest size was rounded up from it (a raw
    /// file whose length is not a multiple of 512: see [`Source::rounded`]).
    pub fn rounded(&self) -> Option<Rounded> {
        match self {
            Input::Image(s) => s.rounded(),
            Input::Stream(_) => None,
        }
    }

    /// How a compressed image was decompressed into a temporary file, if
    /// it was (see [`Source::decompressed`]).
    pub fn decompressed(&self) -> Option<crate::Decompressed> {
        match self {
            Input::Image(s) => s.decompressed(),
            Input::Stream(_) => None,
        }
    }
}

/// Open `name`: `-` is standard input; an NBD URL (`nbd://`, `nbd+unix://`,
/// `nbds://`, `nbds+unix://`) is its export's raw bytes; an HTTP(S) URL is
/// the file it names, raw or qcow2 or a virtnbdbackup stream (see
/// [`crate::http`]); a regular file or block device is an image (qcow2 or
/// raw, a virtnbdbackup stream, or another format QEMU reads, probed
/// unless `opts.format` says); a FIFO or character device is a
/// stream (its raw bytes). A file, URL or pipe compressed with gzip, xz
/// or zstd (probed unless `opts.format` says) is the image it holds: a
/// raw image a stream, a qcow2 image (or another QEMU reads) decompressed
/// into a temporary file ([`Source::decompressed`]). A name that is no
/// file and looks like a URL of another scheme (`ndb://`, `ftp://`) is an
/// error saying so.
///
/// With `opts.chain`, a name with commas (`FULL,INC1,INC2`) is a chain of
/// image files, oldest first, each read over the one before as its
/// backing image, as if chained with `qemu-img rebase -u`: the first any
/// image (`opts.format` is its format), the others qcow2 images that name
/// no backing file (standalone backups, as KubeVirt writes them). With
/// `opts.size`, only the image's first `size` bytes.
///
/// ```no_run
/// let opts = blkimage::OpenOptions { chain: true, ..Default::default() };
/// let disk = blkimage::open("full.qcow2,inc1.qcow2,inc2.qcow2", &opts)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn open(name: impl AsRef<std::ffi::OsStr>, opts: &OpenOptions) -> io::Result<Input> {
    let name = name.as_ref();
    let names: Vec<&std::ffi::OsStr> = match opts.chain {
        true => name
            .as_bytes()
            .split(|b| *b == b',')
            .map(OsStr::from_bytes)
            .collect(),
        false => vec![name],
    };
    let input = match &names[..] {
        [one] => open_one(one, opts)?,
        _ => Input::Image(open_chain(&names, opts)?),
    };
    let input = match input {
        Input::Image(s) if opts.exact_size => exact(s)?,
        input => input,
    };
    match opts.size {
        None => Ok(input),
        Some(size) => first_bytes(input, size),
    }
}

/// `image` at its bytes' size ([`OpenOptions::exact_size`]): a raw image
/// whose size was rounded up is seen up to its own end, as a range of
/// itself; any other image as it is.
fn exact(image: Box<dyn Source>) -> io::Result<Input> {
    let Some(r) = image.rounded() else {
        return Ok(Input::Image(image));
    };
    let window = Window::new(std::sync::Arc::from(image), 0, r.file_size)?;
    Ok(Input::Image(Box::new(window)))
}

/// The first `size` bytes of `input`, as an input of that size (QEMU's
/// raw `size` option, [`crate::OpenOptions::size`]): an image larger is
/// cut, a stream stops there; either shorter is an error.
fn first_bytes(input: Input, size: u64) -> io::Result<Input> {
    match input {
        Input::Image(s) => {
            let have = s.size();
            if size > have {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the size asked for, {size} bytes, is more than the image's {have}"),
                ));
            }
            Ok(Input::Image(Box::new(crate::Window::new(
                std::sync::Arc::from(s),
                0,
                size,
            )?)))
        }
        Input::Stream(r) => Ok(Input::Stream(Box::new(crate::window::Prefix::new(r, size)))),
    }
}

/// The images of `names` as a chain ([`open`] with `opts.chain`).
fn open_chain(names: &[&OsStr], opts: &OpenOptions) -> io::Result<Box<dyn Source>> {
    for n in names {
        let url = n
            .to_str()
            .is_some_and(|n| nbd::is_url(n) || crate::storage::http::url_scheme(n).is_some());
        if n.is_empty() || *n == "-" || url {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "'{}': the images of a chain are files of this host, named between commas",
                    n.to_string_lossy()
                ),
            ));
        }
    }
    let paths: Vec<&Path> = names.iter().map(Path::new).collect();
    let base_opts = OpenOptions {
        chain: false,
        size: None,
        ..opts.clone()
    };
    chain::open_named_chain(&paths, opts, |path| {
        let ft = std::fs::metadata(path)?.file_type();
        if !(ft.is_file() || ft.is_block_device()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        }
        match open_image(path, ft, &base_opts)? {
            Input::Image(s) => Ok(s),
            Input::Stream(_) => Err(io::Error::other("not an image with random access")),
        }
    })
}

/// [`open`] of one name.
fn open_one(name: &OsStr, opts: &OpenOptions) -> io::Result<Input> {
    if let Some(name) = name.to_str().filter(|n| nbd::is_url(n)) {
        if matches!(opts.format, Some(f) if f != Format::Raw) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, nbd::RawOnly));
        }
        return Ok(Input::Image(Box::new(nbd::open_url(name, &opts.nbd)?)));
    }
    if let Some(name) = name.to_str().filter(|n| crate::storage::http::is_url(n)) {
        return http::open(name, opts);
    }
    let stream = |r: Box<dyn Read + Send>| match opts.format {
        Some(f) if f != Format::Raw => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} needs random access, not a stream", f.name()),
        )),
        _ => Ok(Input::Stream(r)),
    };
    // A pipe's first bytes say if it is compressed (unless a format is
    // forced: `-f raw` hashes its bytes as they come).
    let pipe = |mut r: Box<dyn Read + Send>| {
        if opts.format.is_some() {
            return stream(r);
        }
        let head = read_head(&mut r, PROBE_LEN)?;
        let r = Box::new(io::Cursor::new(head.clone()).chain(r));
        match Compression::probe(&head) {
            Some(kind) => compressed::open(kind, r, Vec::new(), opts),
            None => stream(r),
        }
    };
    if name == "-" {
        grow_pipe(&io::stdin());
        return pipe(Box::new(io::stdin()));
    }
    let path = Path::new(name);
    let ft = std::fs::metadata(path)
        .map_err(|e| unknown_scheme(name).unwrap_or(e))?
        .file_type();
    if ft.is_fifo() || ft.is_char_device() || ft.is_socket() {
        let f = File::open(path)?;
        grow_pipe(&f);
        return pipe(Box::new(f));
    }
    // A file of /proc or /sys: its size says nothing of its content
    // (/proc/cpuinfo is 0 bytes long), so it is read as a stream, its
    // bytes as they come, as sha256sum reads it.
    if ft.is_file() {
        let f = File::open(path)?;
        if chain::pseudo_file_system(&f)?.is_some() {
            return stream(Box::new(f));
        }
        if opts.format.is_none() {
            let head = read_head(&mut &f, PROBE_LEN)?;
            if let Some(kind) = Compression::probe(&head) {
                let origin = vec![Origin::File {
                    path: path.to_path_buf(),
                    role: Role::Image,
                }];
                let r = Box::new(io::Cursor::new(head).chain(f));
                return compressed::open(kind, r, origin, opts);
            }
        }
    }
    open_image(path, ft, opts)
}

/// The image at `path` (a regular file or a block device, of type `ft`):
/// a virtnbdbackup stream with its chain, another format QEMU reads, qcow2
/// with its chain, or raw; probed unless `opts.format` says.
fn open_image(path: &Path, ft: std::fs::FileType, opts: &OpenOptions) -> io::Result<Input> {
    if opts.format.is_none() && ft.is_file() && crate::formats::pbs::is_fidx_file(path) {
        return pbs::open(path, opts);
    }
    let file = RawFile::open_with(path, opts)?;
    file.lock(opts.force_share)?;
    let stream = match opts.format {
        None => ft.is_file() && crate::formats::vnbd::probe_file(&file)?,
        Some(Format::Virtnbdbackup) if crate::formats::vnbd::probe_file(&file)? => true,
        Some(Format::Virtnbdbackup) => return Err(not_a_stream()),
        Some(_) => false,
    };
    if stream {
        return Ok(Input::Image(Box::new(vnbd::open(file, path, opts)?)));
    }
    let other = match opts.format {
        Some(Format::Qemu(f)) => Some(f),
        None if !ft.is_block_device() => {
            qemu::probe_format(&File::open(path)?, std::fs::metadata(path)?.len())?
        }
        _ => None,
    };
    if let Some(f) = other {
        drop(file);
        return Ok(Input::Image(Box::new(QemuExport::open(
            path,
            f,
            opts.cache,
            opts.secret_file.as_deref(),
            opts.force_share,
            &opts.nbd,
        )?)));
    }
    let is_qcow2 = match opts.format {
        Some(Format::Raw) => false,
        _ => qcow2::probe(&file)?,
    };
    if !is_qcow2 {
        if opts.format == Some(Format::Qcow2) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "qcow2: not a qcow2 image",
            ));
        }
        return Ok(Input::Image(Box::new(file)));
    }
    let mut chain = vec![std::fs::canonicalize(path)?];
    Ok(Input::Image(Box::new(chain::open_file(
        file, path, opts, &mut chain,
    )?)))
}

/// The error for `-f virtnbdbackup` of what is no such stream.
fn not_a_stream() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "virtnbdbackup: not a virtnbdbackup stream (no stream header at its start)",
    )
}

/// The schemes of the URLs [`open`] takes, for the message naming them.
const URL_SCHEMES: &str = "NBD URLs start with nbd://, nbds://, nbd+unix:// or nbds+unix://, \
                           HTTP ones with http:// or https://";

/// The error for `name`, a name that is no file, if it looks like a URL
/// of a scheme [`open`] does not take: a misspelt `ndb://` then says so,
/// not "No such file or directory".
///
/// ```
/// let e = blkimage::unknown_scheme("ndb://host/disk".as_ref()).unwrap();
/// assert!(e.to_string().starts_with("unknown URL scheme 'ndb'; NBD URLs start with nbd://"));
/// assert!(blkimage::unknown_scheme("disk.img".as_ref()).is_none());
/// ```
pub fn unknown_scheme(name: &std::ffi::OsStr) -> Option<io::Error> {
    let scheme = crate::storage::http::url_scheme(name.to_str()?)?;
    Some(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("unknown URL scheme '{scheme}'; {URL_SCHEMES}"),
    ))
}

/// The buffer a pipe is given, if it is one: the most an unprivileged
/// process may ask for by default (/proc/sys/fs/pipe-max-size). The
/// default 64 KiB means a wakeup of each side per 64 KiB: on a 2-core VM,
/// `cat | cat` moves 1.1 GB/s, and 4.4 GB/s with 1 MiB.
const PIPE_SIZE: libc::c_int = 1 << 20;

/// Give `fd` a pipe buffer of [`PIPE_SIZE`] if it is a pipe. A failure is
/// ignored: the pipe works as it is (the user may be over their limit of
/// pipe memory, /proc/sys/fs/pipe-user-pages-soft).
fn grow_pipe(fd: &impl std::os::fd::AsRawFd) {
    let fd = fd.as_raw_fd();
    // SAFETY: fstat fills a stat we own; fcntl on a descriptor we hold.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO {
            libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_SIZE);
        }
    }
}

impl RawFile {
    /// [`RawFile::open`] as `opts` ask: direct I/O unless `opts.cache`,
    /// and read from memory maps as `opts.map` says (see [`RawFile::map_reads`]).
    pub fn open_with(path: &Path, opts: &OpenOptions) -> io::Result<RawFile> {
        let mut file = RawFile::open(path, !opts.cache)?;
        file.map_reads(opts.map)?;
        Ok(file)
    }
}
