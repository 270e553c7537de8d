//! An NBD export as a [`Source`]: reads split into several requests in
//! flight (over several connections when the server allows multi-conn),
//! block status mapping holes and zeros so they are never transferred,
//! and a QEMU dirty bitmap read through its metadata context.

use super::connection::{Connection, Ticket};
use super::handshake::{self, Export, Greeting, Timed, Wanted};
use super::protocol::{
    DIRTY_BITMAP_PREFIX, FLAG_CAN_MULTI_CONN, FLAG_READ_ONLY, FLAG_SEND_FLUSH,
    FLAG_SEND_WRITE_ZEROES, STATE_DIRTY, STATE_HOLE, STATE_ZERO, malformed,
};
use super::transport::{Socket, Split};
use super::url::{Address, NbdUrl};
use crate::bitmap::RangeBuilder;
use crate::bitmap::{BitmapInfo, Dirty};
use crate::source::{Extent, ExtentKind, Origin, Remote, Source};
use rustls::ClientConfig;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How to connect.
#[derive(Clone, Debug)]
pub struct NbdOptions {
    /// Socket read and write timeout: a server silent this long is an error.
    pub timeout: Option<Duration>,
    /// Connections at most, used when the server offers multi-conn.
    pub connections: usize,
    /// TLS certificates directory (when the URL does not name one).
    pub tls_certificates: Option<PathBuf>,
    /// A dirty bitmap to negotiate (the `qemu:dirty-bitmap:NAME` metadata
    /// context, next to base:allocation) so that [`Source::dirty`] can
    /// read it: a server that does not offer it is an error at connect.
    pub dirty_bitmap: Option<String>,
    /// List the server's dirty bitmaps while connecting
    /// (NBD_OPT_LIST_META_CONTEXT), for [`Source::bitmaps`]: one more
    /// round trip, so only when asked.
    pub list_bitmaps: bool,
}

impl Default for NbdOptions {
    fn default() -> NbdOptions {
        NbdOptions {
            timeout: None,
            connections: 4,
            tls_certificates: None,
            dirty_bitmap: None,
            list_bitmaps: false,
        }
    }
}

/// Bytes per read request at most (less if the server says so). One read of
/// the default 1 MiB is one request: the digest workers already keep one
/// read each in flight, and splitting it into 256 KiB requests cost the
/// server (qemu-nbd, single-threaded) more CPU per byte for no gain on a
/// 2-core machine (0.87-1.17 s vs 0.96-1.26 s for 1 GiB of data).
const REQUEST_SIZE: u32 = 1 << 20;
/// Block status is asked for ranges this large (a multiple of any minimum
/// block size); the server may answer for less.
const STATUS_SIZE: u64 = 0xffff_0000;

/// Bytes of reads an export keeps in flight by default (`default_io_depth`):
/// enough requests to hide a network's latency (16 reads of the default 1
/// MiB), few enough buffers to keep memory small whatever the read size.
/// (32 gained 1.02x against 1.06x the time of reading alone at 10 ms per
/// request, and cost a local qemu-nbd 1.09x: docs/performance.md, remote.)
const NBD_BYTES_IN_FLIGHT: usize = 16 << 20;

/// An NBD export.
pub struct Nbd {
    format: String,
    /// The first connection; more may join ([`Extra`]).
    first: Connection,
    extra: Arc<Extra>,
    next: AtomicUsize,
    export: Export,
    request_size: usize,
    /// The dirty bitmap negotiated on the first connection
    /// ([`NbdOptions::dirty_bitmap`]).
    bitmap: Option<String>,
    /// [`NbdOptions::list_bitmaps`]: `export.listed` is the server's list.
    list_bitmaps: bool,
    /// Where it is and which export: what a record of it holds.
    origin: Remote,
}

/// Connections beyond the first, made on threads of their own while the
/// first one works: a server at its limit of clients (qemu-nbd's
/// --shared) may answer one only when another client leaves, or never,
/// and a run must not wait for that. Each slot is set once, when its
/// connection is ready.
struct Extra {
    slots: Vec<OnceLock<Connection>>,
}

impl Extra {
    fn ready(&self) -> impl Iterator<Item = &Connection> {
        self.slots.iter().filter_map(OnceLock::get)
    }
}

/// What names an export: its address (`tcp HOST:PORT` or `unix SOCKET`),
/// TLS or not, and its name. An export has no version to tell: whether
/// its content is the one recorded is for samples of it to say.
fn origin(url: &NbdUrl) -> Remote {
    let (kind, at) = match &url.address {
        Address::Tcp { host, port } => ("tcp", format!("{host}:{port}")),
        // One socket however it is written: `socket=nbd.sock` from the
        // socket's directory is the export `socket=/run/x/nbd.sock` was.
        Address::Unix(p) => {
            let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            ("unix", p.to_string_lossy().into_owned())
        }
    };
    let tls = if url.tls { "tls" } else { "plain" };
    Remote {
        kind: "nbd".into(),
        what: "export".into(),
        name: vec![kind.into(), at, tls.into(), url.export.clone()],
        version: Vec::new(),
    }
}

fn describe(addr: &Address) -> String {
    match addr {
        Address::Tcp { host, port } => format!("{host}:{port}"),
        Address::Unix(p) => p.display().to_string(),
    }
}

/// How long an extra connection may wait for the server's greeting. A
/// server at its limit of clients (qemu-nbd's --shared) leaves a new
/// connection waiting in its listen queue, unanswered: without a limit,
/// clients that each hold some connections and wait for more would wait
/// for each other forever.
const EXTRA_HANDSHAKE: Duration = Duration::from_secs(2);

/// One connection, negotiated and in transmission (`tls`: the TLS
/// configuration, for nbds:// URLs). `extra`: one more connection to an
/// export already open, given up after [`EXTRA_HANDSHAKE`]; it negotiates
/// no dirty bitmap and lists none (the first connection reads the bitmap,
/// and the others' block status need not carry it).
fn connect_one(
    url: &NbdUrl,
    opts: &NbdOptions,
    tls: Option<&Arc<ClientConfig>>,
    extra: bool,
) -> io::Result<Connection> {
    let mut sock = Socket::connect(&url.address, opts.timeout).map_err(|e| {
        let shown = format!("cannot connect to {}: {e}", describe(&url.address));
        crate::oserror::with_context(e, shown)
    })?;
    if extra {
        let wait = opts
            .timeout
            .map_or(EXTRA_HANDSHAKE, |t| t.min(EXTRA_HANDSHAKE));
        if !sock.speaks_within(wait, opts.timeout)? {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the server did not greet another connection",
            ));
        }
    }
    let want = if extra {
        Wanted::default()
    } else {
        Wanted {
            bitmap: opts.dirty_bitmap.as_deref(),
            list_bitmaps: opts.list_bitmaps,
        }
    };
    let mut timed = Timed::new(&mut sock, opts.timeout);
    let greeting = handshake::greet(&mut timed)?;
    if let Some(config) = tls {
        let Greeting::Newstyle { fixed: true, .. } = greeting else {
            return Err(io::Error::other("the server cannot do TLS (old handshake)"));
        };
        // STARTTLS comes first: everything after it, NBD_OPT_GO included,
        // is encrypted.
        handshake::starttls(&mut timed)?;
        drop(timed);
        let mut tls = super::tls::connect(sock, url.tls_server_name(), config, opts.timeout)?;
        let negotiated = {
            let mut timed = Timed::new(&mut tls, opts.timeout);
            handshake::negotiate(&mut timed, greeting, &url.export, want)
        };
        let export = negotiated.map_err(|e| tls.after_handshake(e))?;
        let split = super::tls::split(tls)?;
        return Connection::new(split, export, opts.timeout);
    }
    let export = handshake::negotiate(&mut timed, greeting, &url.export, want).map_err(|e| {
        if handshake::is_tls_required(&e) {
            let scheme = match url.address {
                Address::Tcp { .. } => "nbds://",
                Address::Unix(_) => "nbds+unix://",
            };
            io::Error::new(e.kind(), format!("{e}: use {scheme}"))
        } else {
            e
        }
    })?;
    // The socket's read timeout back to the option's, for transmission.
    drop(timed);
    Connection::new(Split::plain(sock)?, export, opts.timeout)
}

impl Nbd {
    /// Connect to `url` (several connections if the server allows it).
    pub fn connect(url: &NbdUrl, opts: &NbdOptions) -> io::Result<Nbd> {
        // Certificates are loaded once, before talking to the server: a
        // local mistake (no ca-cert.pem) never reaches it.
        let tls = if url.tls {
            let certs = url
                .tls_certificates
                .as_deref()
                .or(opts.tls_certificates.as_deref());
            Some(Arc::new(super::tls::config(certs)?))
        } else {
            None
        };
        let first = connect_one(url, opts, tls.as_ref(), false)?;
        let export = first.export.clone();
        let wanted = match export.flags & FLAG_CAN_MULTI_CONN {
            0 => 0,
            _ => opts.connections.max(1) - 1,
        };
        let extra = Arc::new(Extra {
            slots: (0..wanted).map(|_| OnceLock::new()).collect(),
        });
        // One after the other, on one thread: a server that refuses one
        // (at its limit of clients) would refuse the next too.
        if wanted > 0 {
            let (extra, url, opts, tls) = (extra.clone(), url.clone(), opts.clone(), tls.clone());
            let size = export.size;
            let started = std::thread::Builder::new()
                .name("nbd-connect".into())
                .spawn(move || {
                    for slot in &extra.slots {
                        // More connections only help: a server that refuses
                        // them leaves us with fewer.
                        match connect_one(&url, &opts, tls.as_ref(), true) {
                            Ok(c) if c.export.size == size => {
                                let _ = slot.set(c);
                            }
                            _ => break,
                        }
                    }
                });
            // No thread (the system's limit): one connection does.
            drop(started);
        }
        let min = export.min_block.max(1);
        let request_size = (REQUEST_SIZE.min(export.max_payload) / min * min).max(min) as usize;
        Ok(Nbd {
            format: "raw".into(),
            first,
            extra,
            next: AtomicUsize::new(0),
            export,
            request_size,
            bitmap: opts.dirty_bitmap.clone(),
            list_bitmaps: opts.list_bitmaps,
            origin: origin(url),
        })
    }

    /// Report `format` (the image format a qemu-nbd export serves).
    pub fn set_format(&mut self, format: &str) {
        self.format = format.to_string();
    }

    /// Connections in use now (more may join while the first works).
    pub fn connections(&self) -> usize {
        1 + self.extra.ready().count()
    }

    /// The server's block size constraints: minimum, preferred, maximum payload.
    pub fn block_sizes(&self) -> (u32, u32, u32) {
        let e = &self.export;
        (e.min_block, e.preferred_block, e.max_payload)
    }

    /// True if the server maps holes and zeros (base:allocation).
    pub fn has_block_status(&self) -> bool {
        self.export.allocation.is_some()
    }

    /// The next connection, in turn among those ready.
    fn conn(&self) -> &Connection {
        let n = self.connections();
        match self.next.fetch_add(1, Ordering::Relaxed) % n {
            0 => &self.first,
            i => self.extra.ready().nth(i - 1).unwrap_or(&self.first),
        }
    }

    /// Every connection ready now.
    fn all(&self) -> impl Iterator<Item = &Connection> {
        std::iter::once(&self.first).chain(self.extra.ready())
    }

    /// True if the export takes writes (the server did not say read-only).
    pub fn is_writable(&self) -> bool {
        self.export.flags & FLAG_READ_ONLY == 0
    }

    /// The end of a `what` ("read", "write") of `len` bytes at `offset`, if
    /// it is inside the export, and the server's minimum block size.
    fn request_end(&self, offset: u64, len: u64, what: &str) -> io::Result<(u64, u64)> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.export.size)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} past the end of the export"),
                )
            })?;
        Ok((end, self.export.min_block.max(1) as u64))
    }

    /// Check that `[offset, offset + len)` can be written: a writable
    /// export, inside it, aligned to the server's minimum block size.
    fn writable_range(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.is_writable() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the export is read-only",
            ));
        }
        let (end, min) = self.request_end(offset, len, "write")?;
        if !offset.is_multiple_of(min) || !(end.is_multiple_of(min) || end == self.export.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "write of {len} bytes at {offset} is not aligned to the server's {min}-byte blocks"
                ),
            ));
        }
        Ok(())
    }

    /// Wait for every ticket; the first error.
    fn wait_all(
        tickets: Vec<(&Connection, Ticket)>,
        mut first_err: Option<io::Error>,
    ) -> io::Result<()> {
        for (c, t) in tickets {
            if let Err(e) = c.wait(t) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Write `buf` at `offset`: requests of at most 1 MiB (less if the
    /// server says so) in flight together over the connections. The range
    /// must be aligned to the server's minimum block size (or end at the
    /// export's end). Durable only after [`Nbd::flush`].
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writable_range(offset, buf.len() as u64)?;
        let mut tickets = Vec::new();
        let mut first_err = None;
        for (i, piece) in buf.chunks(self.request_size).enumerate() {
            let c = self.conn();
            match c.start_write(piece, offset + (i * self.request_size) as u64) {
                Ok(t) => tickets.push((c, t)),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        Self::wait_all(tickets, first_err)
    }

    /// Make `len` bytes at `offset` read as zeros: NBD_CMD_WRITE_ZEROES,
    /// which lets the server punch a hole, when it has the command; else
    /// zeros are written.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable_range(offset, len)?;
        if self.export.flags & FLAG_SEND_WRITE_ZEROES == 0 {
            let zeros = blkhash::try_zeroed(self.request_size, "zeros to write")?;
            let mut pos = offset;
            while pos < offset + len {
                let n = (offset + len - pos).min(zeros.len() as u64) as usize;
                self.write_at(&zeros[..n], pos)?;
                pos += n as u64;
            }
            return Ok(());
        }
        // The length field is 32 bits: split, keeping pieces aligned.
        let min = self.export.min_block.max(1) as u64;
        let step = STATUS_SIZE / min * min;
        let mut tickets = Vec::new();
        let mut first_err = None;
        let mut pos = offset;
        while pos < offset + len {
            let n = (offset + len - pos).min(step);
            let c = self.conn();
            match c.start_write_zeroes(pos, n as u32) {
                Ok(t) => tickets.push((c, t)),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
            pos += n;
        }
        Self::wait_all(tickets, first_err)
    }

    /// Make every write the server completed durable: NBD_CMD_FLUSH on
    /// each connection (one would do with multi-conn, but a flush per
    /// connection is correct with or without it). A server that does not
    /// offer flush (NBD_FLAG_SEND_FLUSH unset) has no write cache to flush,
    /// by the protocol: nothing is sent.
    pub fn flush(&self) -> io::Result<()> {
        if self.export.flags & FLAG_SEND_FLUSH == 0 {
            return Ok(());
        }
        for c in self.all() {
            c.flush()?;
        }
        Ok(())
    }

    /// The ranges the negotiated bitmap marks dirty, over the whole export:
    /// block status for its context, one request after another from where
    /// the last answer ended (the server may answer for less than asked),
    /// on the first connection, the one that negotiated it. Every answer
    /// makes progress (at least one descriptor, none empty) and lies in its
    /// request but for the last descriptor's end, which the spec lets run
    /// past and which is clipped; descriptors after it are an error. The
    /// ranges grow with what the server sends, never with what it claims,
    /// and past [`crate::bitmap::MAX_DIRTY_RANGES`] are widened, not multiplied.
    fn dirty_ranges(&self, context: &str) -> io::Result<Vec<Range<u64>>> {
        let size = self.export.size;
        let mut ranges = RangeBuilder::new(size);
        let mut pos = 0;
        while pos < size {
            let (start, end) = (pos, pos + (size - pos).min(STATUS_SIZE));
            let descs = self
                .first
                .block_status(pos, (end - pos) as u32)?
                .bitmap
                .ok_or_else(|| {
                    malformed(format!(
                        "block status without a chunk for {context} (the server must answer \
                         for every negotiated context)"
                    ))
                })?;
            for (n, flags) in descs {
                if pos >= end {
                    return Err(malformed(format!(
                        "block status for {context} past the request [{start}, {end})"
                    )));
                }
                let n = (n as u64).min(end - pos);
                if flags & STATE_DIRTY != 0 {
                    ranges.push(pos, pos + n);
                }
                pos += n;
            }
            if pos == start {
                // Descriptors are never empty: only a parser change could get here.
                return Err(malformed(format!("empty block status for {context}")));
            }
        }
        Ok(ranges.finish())
    }

    /// Read an aligned range: requests in flight together, then waited for.
    fn read_aligned(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut tickets: Vec<(&Connection, Ticket)> = Vec::new();
        let mut first_err = None;
        for (i, piece) in buf.chunks_mut(self.request_size).enumerate() {
            let c = self.conn();
            let at = offset + (i * self.request_size) as u64;
            // SAFETY: every ticket is waited for below before `buf` is released.
            match unsafe { c.start_read(piece, at) } {
                Ok(t) => tickets.push((c, t)),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        Self::wait_all(tickets, first_err)
    }
}

impl Source for Nbd {
    fn format(&self) -> &str {
        &self.format
    }

    fn size(&self) -> u64 {
        self.export.size
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let data = |len| Extent {
            offset,
            len,
            kind: ExtentKind::Data,
        };
        if self.export.allocation.is_none() {
            return Ok(vec![data(len)]);
        }
        let ask = len.min(STATUS_SIZE) as u32;
        let descs = self
            .conn()
            .block_status(offset, ask)?
            .allocation
            .ok_or_else(|| malformed("block status without a base:allocation chunk"))?;
        let mut out: Vec<Extent> = Vec::new();
        let mut pos = offset;
        let end = offset + ask as u64;
        for (n, flags) in descs {
            if pos >= end {
                break;
            }
            let n = (n as u64).min(end - pos);
            let kind = if flags & STATE_ZERO == 0 {
                ExtentKind::Data
            } else if flags & STATE_HOLE != 0 {
                ExtentKind::Hole
            } else {
                ExtentKind::Zero
            };
            match out.last_mut() {
                Some(last) if last.kind == kind => last.len += n,
                _ => out.push(Extent {
                    offset: pos,
                    len: n,
                    kind,
                }),
            }
            pos += n;
        }
        if out.is_empty() {
            return Err(super::protocol::malformed("empty block status"));
        }
        Ok(out)
    }

    fn origin(&self) -> Vec<Origin> {
        vec![Origin::Remote(self.origin.clone())]
    }

    /// The listed bitmaps ([`NbdOptions::list_bitmaps`]), else the
    /// negotiated one alone; NBD says nothing of their granularity or
    /// flags.
    fn bitmaps(&self) -> io::Result<Vec<BitmapInfo>> {
        let mut names: Vec<&str> = Vec::new();
        if self.list_bitmaps {
            names.extend(self.export.listed.iter().map(String::as_str));
        }
        if let Some(b) = self.bitmap.as_deref()
            && !names.contains(&b)
        {
            names.push(b);
        }
        Ok(names.into_iter().map(nbd_bitmap).collect())
    }

    /// The bitmap asked for at connect ([`NbdOptions::dirty_bitmap`], set
    /// by whoever opens for an update): a server gives a bitmap's context
    /// to NBD_OPT_SET_META_CONTEXT, during the handshake, so any other
    /// name is a bitmap this connection does not have.
    fn dirty(&self, name: &str) -> io::Result<Dirty> {
        if self.bitmap.as_deref() != Some(name) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("dirty bitmap '{name}' was not asked for when connecting"),
            ));
        }
        let ranges = self.dirty_ranges(&format!("{DIRTY_BITMAP_PREFIX}{name}"))?;
        Ok(Dirty {
            bitmap: nbd_bitmap(name),
            ranges,
        })
    }

    /// Latency, not the digest threads, bounds an export across a network:
    /// 16 MiB of reads in flight (16 of the default 1 MiB),
    /// at least one and at most [`crate::source::DEFAULT_IO_DEPTH`]. Sized by bytes,
    /// so a large read size does not multiply the buffers; the server's
    /// maximum payload only splits each read into requests, which each
    /// connection bounds (64 requests in flight).
    fn default_io_depth(&self, read_size: usize) -> usize {
        (NBD_BYTES_IN_FLIGHT / read_size.max(1)).clamp(1, crate::source::DEFAULT_IO_DEPTH)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let (end, min) = self.request_end(offset, buf.len() as u64, "read")?;
        if offset.is_multiple_of(min) && (end.is_multiple_of(min) || end == self.export.size) {
            return self.read_aligned(buf, offset);
        }
        // The server wants aligned requests: read around and copy.
        let start = offset / min * min;
        let stop = end.next_multiple_of(min).min(self.export.size);
        let mut tmp = blkhash::try_zeroed((stop - start) as usize, "an aligned read")?;
        self.read_aligned(&mut tmp, start)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&tmp[at..at + buf.len()]);
        Ok(())
    }
}

/// A bitmap as an NBD export describes it: by name only.
fn nbd_bitmap(name: &str) -> BitmapInfo {
    BitmapInfo {
        name: name.to_string(),
        granularity: None,
        in_use: None,
        enabled: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_is_one_export_however_it_is_named() {
        let cwd = std::env::current_dir().unwrap();
        let of = |url: &str| origin(&NbdUrl::parse(url).unwrap()).name;
        let full = of(&format!("nbd+unix:///d?socket={}/nbd.sock", cwd.display()));
        assert_eq!(of("nbd+unix:///d?socket=nbd.sock"), full);
        assert_eq!(of("nbd+unix:///d?socket=./nbd.sock"), full);
        assert!(full[0] == "unix" && full[1].starts_with('/'), "{full:?}");
    }
}
