//! Image formats read through QEMU: a private `qemu-nbd --read-only` on a
//! unix socket in a private temporary directory (mode 0700), read with the
//! NBD client. The directory is removed as soon as every connection is
//! made (or on any error before); the server is stopped (killed and waited
//! for) when the export is dropped: after a checksum, an error or an
//! interrupt.

use crate::source::{Extent, Origin, Role, Source};
use crate::storage::nbd::{Address, Nbd, NbdOptions, NbdUrl};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The formats handed to qemu-nbd (QEMU's driver names).
pub const FORMATS: &[&str] = &[
    "vmdk",
    "vdi",
    "vhdx",
    "vpc",
    "qed",
    "parallels",
    "dmg",
    "qcow",
    "bochs",
    "cloop",
    "luks",
];

/// How long qemu-nbd may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

fn at(file: &File, offset: u64, n: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; n];
    file.read_exact_at(&mut b, offset).ok()?;
    Some(b)
}

/// The QEMU format of `file` from its magic bytes, if it is one of
/// [`QEMU_FORMATS`](crate::QEMU_FORMATS) (raw and qcow2 are not: blkimage reads those itself).
/// LUKS is reported as "luks" (it needs a passphrase: a secret file).
pub fn probe_format(file: &File, size: u64) -> io::Result<Option<&'static str>> {
    let head = at(file, 0, 512.min(size as usize)).unwrap_or_default();
    probe_bytes(&head, size, |offset, len| at(file, offset, len))
}

/// [`probe_format`] of a file whose first bytes (up to 512) are `head`
/// and whose length is `size`; `tail(offset, len)` reads the bytes of a
/// trailer, if it can.
pub(crate) fn probe_bytes(
    head: &[u8],
    size: u64,
    tail: impl FnOnce(u64, usize) -> Option<Vec<u8>>,
) -> io::Result<Option<&'static str>> {
    let starts = |m: &[u8]| head.starts_with(m);
    let fmt = if starts(b"KDMV") || starts(b"# Disk DescriptorFile") {
        Some("vmdk")
    } else if head.len() >= 0x44 && head[0x40..0x44] == [0x7f, 0x10, 0xda, 0xbe] {
        Some("vdi")
    } else if starts(b"vhdxfile") {
        Some("vhdx")
    } else if starts(b"conectix") {
        Some("vpc")
    } else if starts(b"QED\0") {
        Some("qed")
    } else if starts(b"WithoutFreeSpace") || starts(b"WithouFreSpacExt") {
        Some("parallels")
    } else if starts(b"LUKS\xba\xbe") {
        Some("luks")
    } else if starts(b"QFI\xfb") && head.get(4..8) == Some(&[0, 0, 0, 1]) {
        Some("qcow")
    } else if starts(b"Bochs Virtual HD Image") {
        Some("bochs")
    } else if starts(b"#!/bin/sh\n#V2.0 Format\n") {
        Some("cloop")
    } else if size >= 1024 && size.is_multiple_of(512) {
        // Trailers: a fixed VHD's footer, a dmg's koly block.
        match tail(size - 512, 8).as_deref() {
            Some(b"conectix") => Some("vpc"),
            Some(t) if t.starts_with(b"koly") => Some("dmg"),
            _ => None,
        }
    } else {
        None
    };
    Ok(fmt)
}

/// How long a writable qemu-nbd may take to flush and exit on SIGTERM
/// before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running qemu-nbd and its private directory.
struct Server {
    child: Child,
    dir: Option<tempfile::TempDir>,
    /// Writable: stopped with SIGTERM, on which qemu-nbd flushes and
    /// closes the image (a killed one loses the qcow2 metadata it caches).
    graceful: bool,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.graceful {
            // SAFETY: kill on the pid of our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while start.elapsed() < STOP_TIMEOUT {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }
}

/// QEMU's option syntax: a comma in a value is written twice.
fn qemu_escape(p: &Path) -> io::Result<String> {
    let s = p.to_str().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a UTF-8 path", p.display()),
        )
    })?;
    Ok(s.replace(',', ",,"))
}

/// An image served by a private qemu-nbd, as a [`Source`].
pub struct QemuExport {
    // Dropped in this order: disconnect, then stop the server.
    nbd: Nbd,
    _server: Server,
}

impl QemuExport {
    /// Serve `path` in `format` with qemu-nbd and connect to it. `cache`:
    /// qemu-nbd's --cache=writeback, else --cache=none (direct I/O).
    /// `secret`: a file holding the passphrase of a LUKS image (its bytes
    /// as they are, as QEMU's `--object secret,file=` reads them; see
    /// `read_secret`). `force_share`: ignore other processes' image locks
    /// (qemu-img's `-U`); else an image a writer holds is an error
    /// ([`io::ErrorKind::ResourceBusy`], "in use").
    ///
    /// ```no_run
    /// use blkimage::nbd::NbdOptions;
    /// use blkimage::{QemuExport, Source};
    /// use std::path::Path;
    /// let disk = QemuExport::open(
    ///     Path::new("disk.luks"),
    ///     "luks",
    ///     false,
    ///     Some(Path::new("passphrase.txt")),
    ///     false,
    ///     &NbdOptions::default(),
    /// )
    /// .unwrap();
    /// println!("{} bytes", disk.size());
    /// ```
    pub fn open(
        path: &Path,
        format: &str,
        cache: bool,
        secret: Option<&Path>,
        force_share: bool,
        opts: &NbdOptions,
    ) -> io::Result<QemuExport> {
        let (nbd, server) = serve(&Serve {
            path,
            format,
            cache,
            secret,
            force_share,
            writable: false,
            opts,
        })?;
        Ok(QemuExport {
            nbd,
            _server: server,
        })
    }
}

/// An image written through a private qemu-nbd (qcow2, or any format QEMU
/// writes): the connection to write it with, and the server, stopped with
/// SIGTERM (it flushes and closes the image) when this is dropped.
pub struct QemuTarget {
    // Dropped in this order: disconnect, then stop the server.
    nbd: Arc<Nbd>,
    _server: Server,
}

impl QemuTarget {
    /// Serve `path` in `format` writable (`--cache=writeback`, flushed by
    /// NBD_CMD_FLUSH; `--discard=unmap`, so zeroed ranges free their
    /// clusters) and connect to it.
    pub fn open(path: &Path, format: &str, opts: &NbdOptions) -> io::Result<QemuTarget> {
        let (nbd, server) = serve(&Serve {
            path,
            format,
            cache: true,
            secret: None,
            force_share: false,
            writable: true,
            opts,
        })?;
        Ok(QemuTarget {
            nbd: Arc::new(nbd),
            _server: server,
        })
    }

    /// The connection; the server runs as long as this target lives.
    pub fn nbd(&self) -> Arc<Nbd> {
        self.nbd.clone()
    }
}

/// The largest secret file read: far more than any passphrase (cryptsetup
/// takes at most 512 characters typed in), small enough to hold in memory.
pub const MAX_SECRET_BYTES: u64 = 64 << 10;

/// The bytes of the secret file `path`, read here so that qemu-nbd never
/// opens it: it must be a regular file of at most [`MAX_SECRET_BYTES`]. A
/// FIFO, a device (`/dev/zero`) or a directory is refused at once: opened
/// without blocking, never read.
pub fn read_secret(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let ctx = |e: io::Error| {
        let shown = format!("secret file {}: {e}", path.display());
        crate::oserror::with_context(e, shown)
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(ctx)?;
    let meta = file.metadata().map_err(ctx)?;
    if !meta.is_file() {
        return Err(ctx(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    if meta.len() > MAX_SECRET_BYTES {
        return Err(ctx(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} bytes: larger than a passphrase can be (at most {MAX_SECRET_BYTES})",
                meta.len()
            ),
        )));
    }
    let mut bytes = Vec::new();
    // One byte past the limit: a file that grew since fstat is caught too.
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(ctx)?;
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        return Err(ctx(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("larger than a passphrase can be (at most {MAX_SECRET_BYTES} bytes)"),
        )));
    }
    Ok(bytes)
}

/// Stop the qemu-nbd servers left serving a socket in `dir` by a run that
/// died while they started. A writable server is told to stop by SIGTERM
/// when its parent dies (so that it flushes), but qemu-nbd loses a SIGTERM
/// that comes while it starts up; once up, it acts on one. Waits up to 10 s
/// for each to exit (it flushes and closes its image, releasing its locks).
fn stop_orphans(dir: &Path) {
    let socket = format!("--socket={}", dir.join("nbd.sock").display());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let serves = std::fs::read(p.path().join("cmdline"))
            .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == socket.as_bytes()));
        if !serves {
            continue;
        }
        // SAFETY: signals to a process found above; kill(pid, 0) checks it.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t = std::time::Instant::now();
        while unsafe { libc::kill(pid, 0) } == 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The prefix of the private directories, `$TMPDIR/blkimage-PID-XXXXXX`.
const DIR_PREFIX: &str = "blkimage-";

/// Remove the private directories of runs that died (SIGKILL) before they
/// could: ours by owner and name, their process gone. A directory lives
/// only while its qemu-nbd starts (it is removed once connected), so only
/// a run killed in that moment leaves one.
fn remove_stale_dirs(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // SAFETY: plain syscall.
    let uid = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|&p| p > 0)
        else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid {
            continue;
        }
        // SAFETY: signal 0 only checks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            stop_orphans(&e.path());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A private directory (mode 0700: it holds the socket that serves the
/// image, and the passphrase of a LUKS image while qemu-nbd starts).
fn private_dir() -> io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = std::env::temp_dir();
    remove_stale_dirs(&tmp);
    tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(&tmp)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot make a private directory for qemu-nbd's socket in {} \
                     (TMPDIR names another): {e}",
                    tmp.display()
                ),
            )
        })
}

/// Opening a LUKS image without its passphrase (the `io::Error`'s inner
/// error): a program recognizes it to say how its user gives one.
#[derive(Debug)]
pub struct PassphraseNeeded;

impl std::fmt::Display for PassphraseNeeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a LUKS image needs its passphrase")
    }
}

impl std::error::Error for PassphraseNeeded {}

/// True if qemu-nbd's message says another process holds the image's locks.
fn is_lock_error(msg: &str) -> bool {
    msg.contains("Failed to get") && msg.contains("lock")
}

/// A private qemu-nbd to start: what it serves, and how.
struct Serve<'a> {
    path: &'a Path,
    /// QEMU's driver name.
    format: &'a str,
    /// qemu-nbd's --cache=writeback, else --cache=none (direct I/O).
    cache: bool,
    /// The file with a LUKS image's passphrase.
    secret: Option<&'a Path>,
    /// Read-only, ignoring other processes' image locks (qemu-img's -U).
    force_share: bool,
    /// Served writable (else --read-only).
    writable: bool,
    opts: &'a NbdOptions,
}

/// Start a private qemu-nbd as `s` says and connect to it: build its
/// command, spawn it, connect once it listens.
fn serve(s: &Serve<'_>) -> io::Result<(Nbd, Server)> {
    let secret = if s.format == "luks" {
        let Some(secret) = s.secret else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                PassphraseNeeded,
            ));
        };
        Some(read_secret(secret)?)
    } else {
        None
    };
    if !on_path("qemu-nbd") {
        return Err(not_installed(s.format));
    }
    let dir = private_dir()?;
    let sock = dir.path().join("nbd.sock");
    let log = dir.path().join("qemu-nbd.log");
    let cmd = command(s, dir.path(), &sock, secret.as_deref())?;
    let server = Server {
        child: spawn(cmd, &log, s.writable, s.format)?,
        dir: Some(dir),
        graceful: s.writable,
    };
    connect(server, &sock, &log, s.format, s.opts)
}

/// The qemu-nbd command serving `s.path` on `sock`, in `dir`, the private
/// directory; a LUKS image's passphrase (`secret`) is written there.
fn command(s: &Serve<'_>, dir: &Path, sock: &Path, secret: Option<&[u8]>) -> io::Result<Command> {
    let format = s.format;
    let path = std::path::absolute(s.path)?;
    let mut cmd = Command::new("qemu-nbd");
    cmd.arg(if s.writable {
        "--discard=unmap"
    } else {
        "--read-only"
    })
    .arg(format!("--socket={}", sock.display()))
    .arg(format!(
        "--cache={}",
        if s.cache { "writeback" } else { "none" }
    ))
    .arg(format!("--shared={}", s.opts.connections.max(1)));
    let share = if s.force_share && !s.writable {
        ",force-share=on"
    } else {
        ""
    };
    match secret {
        // The passphrase goes through a 0600 file in the 0700 directory,
        // removed once qemu-nbd has read it: never on a command line.
        Some(bytes) => {
            let file = dir.join("secret");
            {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&file)?
                    .write_all(bytes)?;
            }
            cmd.arg("--object")
                .arg(format!("secret,id=sec0,file={}", qemu_escape(&file)?))
                .arg("--image-opts")
                .arg(format!(
                    "driver=luks,key-secret=sec0{share},file.filename={}",
                    qemu_escape(&path)?
                ))
        }
        None if !share.is_empty() => cmd.arg("--image-opts").arg(format!(
            "driver={format}{share},file.filename={}",
            qemu_escape(&path)?
        )),
        None => cmd.arg(format!("--format={format}")).arg("--").arg(&path),
    };
    Ok(cmd)
}

/// qemu-nbd is not installed: what to install, to read `format` images.
fn not_installed(format: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{format} images go through qemu-nbd, which is not installed: \
             install qemu-utils (Debian, Ubuntu) or qemu-img (Fedora, RHEL)"
        ),
    )
}

/// Whether `name` is a file in a directory of PATH, as the spawn will look
/// for it. Asked first so that a system without qemu-nbd is told so, even
/// where the private directory cannot be made either (a bare chroot with no
/// /tmp, where the static binaries run).
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(name).is_file()))
}

/// Spawn qemu-nbd (`cmd`), its messages to `log`, bound to die with us;
/// an error saying how to install it if it is not installed (to read
/// `format` images).
fn spawn(mut cmd: Command, log: &Path, writable: bool, format: &str) -> io::Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(log)?);
    // If we die, the server goes too. A read-only server has nothing to
    // flush: SIGKILL, which it cannot miss (a SIGTERM that arrives while
    // qemu-nbd opens the image, before its main loop runs, is noted and
    // then never acted on: it waited forever, holding the image's locks).
    // A writable one needs SIGTERM to flush and close the image.
    let death_signal = if writable {
        libc::SIGTERM
    } else {
        libc::SIGKILL
    };
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Not in our process group: a terminal's Ctrl-C is ours to
            // handle.
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, death_signal);
            // We died between fork and prctl: no signal will come.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            not_installed(format)
        } else {
            let shown = format!("cannot run qemu-nbd: {e}");
            crate::oserror::with_context(e, shown)
        }
    })
}

/// Connect to `server` on `sock` once it listens (its messages in `log`
/// say why if it fails first); then remove its private directory.
fn connect(
    mut server: Server,
    sock: &Path,
    log: &Path,
    format: &str,
    opts: &NbdOptions,
) -> io::Result<(Nbd, Server)> {
    let url = NbdUrl {
        address: Address::Unix(sock.to_path_buf()),
        export: String::new(),
        tls: false,
        tls_certificates: None,
        tls_hostname: None,
    };
    let failed = |status| server_failed(log, status);
    let start = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait()? {
            return Err(failed(status));
        }
        if sock.exists() {
            match Nbd::connect(&url, opts) {
                Ok(mut nbd) => {
                    nbd.set_format(format);
                    // Every connection is made: the socket, the secret and
                    // the directory go now, so that not even a SIGKILL
                    // leaves them behind.
                    if let Some(d) = server.dir.take() {
                        let _ = d.close();
                    }
                    return Ok((nbd, server));
                }
                Err(e)
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) || start.elapsed() > START_TIMEOUT =>
                {
                    // qemu-nbd may listen before it fails to open the
                    // image: its own message says more than ours.
                    for _ in 0..200 {
                        if let Some(status) = server.child.try_wait()? {
                            return Err(failed(status));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    return Err(e);
                }
                Err(_) => {}
            }
        }
        if start.elapsed() > START_TIMEOUT {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "qemu-nbd did not start listening",
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// qemu-nbd exited with `status`: its message (from `log`) as the error.
fn server_failed(log: &Path, status: std::process::ExitStatus) -> io::Error {
    let msg = std::fs::read_to_string(log).unwrap_or_default();
    let msg = msg.trim();
    if is_lock_error(msg) {
        // Another process (a VM, a writable qemu-nbd) has the image.
        return io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("in use: qemu-nbd: {msg}"),
        );
    }
    io::Error::other(format!("qemu-nbd failed ({status}): {msg}"))
}

impl Source for QemuExport {
    fn format(&self) -> &str {
        self.nbd.format()
    }
    fn size(&self) -> u64 {
        self.nbd.size()
    }
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.nbd.extents(offset, len)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.nbd.read_at(buf, offset)
    }
    fn finish(&self) -> io::Result<()> {
        self.nbd.finish()
    }

    /// What qemu-nbd has open: it opens every file of the image (extents,
    /// backing files, data files) before it serves, and only QEMU knows
    /// which they are for its many formats.
    /// The first is the image; the others hold more of its guest data.
    fn origin(&self) -> Vec<Origin> {
        let private = self._server.dir.as_ref().map(|d| d.path());
        (open_files(self._server.child.id()).into_iter())
            .filter(|f| !private.is_some_and(|d| f.starts_with(d)))
            .enumerate()
            .map(|(i, path)| Origin::File {
                path,
                role: if i == 0 { Role::Image } else { Role::Data },
            })
            .collect()
    }
}

/// The regular files and block devices process `pid` has open, by
/// descriptor number (files removed since, as its log, left out).
fn open_files(pid: u32) -> Vec<std::path::PathBuf> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut fds: Vec<(u64, std::path::PathBuf)> = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: u64 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            let ft = std::fs::metadata(&target).ok()?.file_type();
            use std::os::unix::fs::FileTypeExt;
            (ft.is_file() || ft.is_block_device()).then_some((fd, target))
        })
        .collect();
    fds.sort();
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    for (_, f) in fds {
        if !files.contains(&f) {
            files.push(f);
        }
    }
    files
}
