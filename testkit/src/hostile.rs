//! A small NBD server that misbehaves on purpose, for the tests of what a
//! hostile or broken server can do to the client (blkimage's, directly;
//! blksum's, through the command): block size constraints
//! that would make it issue 1-byte requests, endless option replies, one
//! byte a second, silence, malformed replies.
//!
//! It speaks the fixed newstyle handshake (NBD_OPT_STRUCTURED_REPLY,
//! NBD_OPT_SET_META_CONTEXT for base:allocation, and for a QEMU dirty
//! bitmap in the bitmap scenarios, NBD_OPT_GO with the
//! export and block size infos) and the transmission phase (reads answered
//! with structured data chunks, block status with one data extent, and
//! disconnect) over a unix socket, one thread per client, with std only:
//! a misbehaviour is a few lines, with no runtime to fight. Without a
//! misbehaviour it serves its export correctly, so a test can also check
//! that what the client reads is right.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;

const CMD_READ: u16 = 0;
const CMD_DISC: u16 = 2;
const CMD_BLOCK_STATUS: u16 = 7;
const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;

/// The transmission flags: has flags, read-only, can multi-conn off.
const EXPORT_FLAGS: u16 = 1 | 2;
/// The base:allocation context id given to the client.
const CONTEXT_ID: u32 = 1;
/// The dirty bitmap's context id, in the bitmap scenarios.
const BITMAP_ID: u32 = 2;
/// In [`Misbehave::DirtyBitmap`], the bitmap's granules and how much of
/// the export one block status answers for (less than asked, and not a
/// whole number of granules, so that dirty ranges straddle answers).
pub const BITMAP_GRANULE: u64 = 4096;
/// See [`BITMAP_GRANULE`].
pub const BITMAP_ANSWER: u64 = 6144;

/// What the server does wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehave {
    /// Nothing: a correct server.
    Nothing,
    /// NBD_INFO_BLOCK_SIZE with these minimum, preferred, maximum sizes.
    BlockSizes(u32, u32, u32),
    /// NBD_REP_INFO replies to NBD_OPT_GO, forever.
    EndlessInfo,
    /// NBD_REP_META_CONTEXT replies to NBD_OPT_SET_META_CONTEXT, forever.
    EndlessMetaContext,
    /// Never answers NBD_OPT_STRUCTURED_REPLY (the first option).
    SilentHandshake,
    /// The replies to NBD_OPT_GO, one byte a second.
    TrickleGo,
    /// Never answers a read.
    SilentRead,
    /// The replies to reads, one byte a second.
    TrickleRead,
    /// A reply to a read with a bad magic.
    BadReplyMagic,
    /// A correct server with a dirty bitmap: any `qemu:dirty-bitmap:NAME`
    /// asked for is given; every other [`BITMAP_GRANULE`] is dirty (the
    /// first one too), and each block status answers for
    /// [`BITMAP_ANSWER`] bytes at most.
    DirtyBitmap,
    /// Gives the bitmap's context, then answers block status for
    /// base:allocation only.
    BitmapChunkMissing,
    /// Gives the bitmap's context, then answers block status with a
    /// descriptor after the one that covers the request.
    BitmapPastRequest,
}

impl Misbehave {
    fn has_bitmap(self) -> bool {
        matches!(
            self,
            Misbehave::DirtyBitmap | Misbehave::BitmapChunkMissing | Misbehave::BitmapPastRequest
        )
    }
}

/// Counters the tests look at.
#[derive(Default)]
pub struct Stats {
    /// Requests received (all kinds).
    pub requests: AtomicUsize,
    /// The most requests waiting for their replies at once.
    pub max_in_flight: AtomicUsize,
}

/// A running hostile server on a unix socket; stopped when dropped.
pub struct Hostile {
    /// The export's NBD URL (`nbd+unix:///?socket=...`).
    pub url: String,
    /// What it received.
    pub stats: Arc<Stats>,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Hostile {
    /// Serve `data` (its length is the export size), misbehaving as told.
    pub fn start(data: Vec<u8>, how: Misbehave) -> Hostile {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("hostile.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let data = Arc::new(data);
        let accept = {
            let stop = stop.clone();
            let stats = stats.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (data, stats, stop) = (data.clone(), stats.clone(), stop.clone());
                    // Client threads are detached: each ends when its client
                    // goes away or the server stops (a write then fails).
                    std::thread::spawn(move || {
                        let _ = serve(conn, &data, how, &stats, &stop);
                    });
                }
            })
        };
        Hostile {
            url: format!("nbd+unix:///?socket={}", socket.display()),
            stats,
            socket,
            stop,
            accept: Some(accept),
            _dir: dir,
        }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = UnixStream::connect(&self.socket);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

fn option_reply(opt: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + payload.len());
    v.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// Write `b` one byte a second (until the client hangs up or we stop).
fn trickle(s: &mut UnixStream, b: &[u8], stop: &AtomicBool) -> io::Result<()> {
    for byte in b {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        s.write_all(std::slice::from_ref(byte))?;
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

/// Hold the connection without a word until the client hangs up or we stop.
fn silence(s: &mut UnixStream, stop: &AtomicBool) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut b = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        match s.read(&mut b) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn serve(
    mut s: UnixStream,
    data: &[u8],
    how: Misbehave,
    stats: &Stats,
    stop: &AtomicBool,
) -> io::Result<()> {
    // Greeting: fixed newstyle, no zeroes.
    let mut g = Vec::new();
    g.extend_from_slice(&NBDMAGIC.to_be_bytes());
    g.extend_from_slice(&IHAVEOPT.to_be_bytes());
    g.extend_from_slice(&3u16.to_be_bytes());
    s.write_all(&g)?;
    let mut flags = [0u8; 4];
    s.read_exact(&mut flags)?;
    loop {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        if be64(&h) != IHAVEOPT {
            return Ok(());
        }
        let (opt, len) = (be32(&h[8..]), be32(&h[12..]));
        let mut payload = vec![0u8; len as usize];
        s.read_exact(&mut payload)?;
        match opt {
            OPT_STRUCTURED_REPLY if how == Misbehave::SilentHandshake => {
                return silence(&mut s, stop);
            }
            OPT_STRUCTURED_REPLY => s.write_all(&option_reply(opt, REP_ACK, &[]))?,
            OPT_SET_META_CONTEXT => {
                if how == Misbehave::EndlessMetaContext {
                    let one = option_reply(opt, REP_META_CONTEXT, &allocation_context());
                    while !stop.load(Ordering::SeqCst) {
                        s.write_all(&one)?;
                    }
                    return Ok(());
                }
                s.write_all(&meta_contexts(opt, &payload, how))?;
            }
            OPT_GO => {
                let mut export = 0u16.to_be_bytes().to_vec();
                export.extend_from_slice(&(data.len() as u64).to_be_bytes());
                export.extend_from_slice(&EXPORT_FLAGS.to_be_bytes());
                let info = option_reply(opt, REP_INFO, &export);
                if how == Misbehave::EndlessInfo {
                    while !stop.load(Ordering::SeqCst) {
                        s.write_all(&info)?;
                    }
                    return Ok(());
                }
                let mut reply = info;
                if let Misbehave::BlockSizes(min, preferred, max) = how {
                    let mut b = 3u16.to_be_bytes().to_vec();
                    for v in [min, preferred, max] {
                        b.extend_from_slice(&v.to_be_bytes());
                    }
                    reply.extend(option_reply(opt, REP_INFO, &b));
                }
                reply.extend(option_reply(opt, REP_ACK, &[]));
                if how == Misbehave::TrickleGo {
                    return trickle(&mut s, &reply, stop);
                }
                s.write_all(&reply)?;
                return transmission(s, data, how, stats, stop);
            }
            _ => s.write_all(&option_reply(opt, REP_ERR_UNSUP, &[]))?,
        }
    }
}

/// The context base:allocation, as a meta context reply carries it.
fn allocation_context() -> Vec<u8> {
    let mut ctx = CONTEXT_ID.to_be_bytes().to_vec();
    ctx.extend_from_slice(b"base:allocation");
    ctx
}

/// The replies to NBD_OPT_SET_META_CONTEXT with `payload`: base:allocation,
/// each dirty bitmap asked for if the server has them, and the ack.
fn meta_contexts(opt: u32, payload: &[u8], how: Misbehave) -> Vec<u8> {
    let mut replies = option_reply(opt, REP_META_CONTEXT, &allocation_context());
    if how.has_bitmap() {
        for q in queries(payload) {
            if q.len() > "qemu:dirty-bitmap:".len() && q.starts_with("qemu:dirty-bitmap:") {
                let mut ctx = BITMAP_ID.to_be_bytes().to_vec();
                ctx.extend_from_slice(q.as_bytes());
                replies.extend(option_reply(opt, REP_META_CONTEXT, &ctx));
            }
        }
    }
    replies.extend(option_reply(opt, REP_ACK, &[]));
    replies
}

/// The queries of NBD_OPT_SET_META_CONTEXT's data (export name, count,
/// queries), as far as they parse.
fn queries(d: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let field = |at: usize| d.get(at..at + 4).map(be32).map(|n| n as usize);
    let Some(name) = field(0) else { return out };
    let mut at = 4 + name;
    let Some(count) = field(at) else { return out };
    at += 4;
    for _ in 0..count {
        let Some(n) = field(at) else { break };
        let Some(q) = d.get(at + 4..at + 4 + n) else {
            break;
        };
        out.push(String::from_utf8_lossy(q).into_owned());
        at += 4 + n;
    }
    out
}

/// The bitmap's block status chunk (not the last of its reply) for a
/// request of `[offset, end)`, as `how` answers it.
fn bitmap_chunk(how: Misbehave, cookie: u64, offset: u64, end: u64) -> Vec<u8> {
    let mut p = BITMAP_ID.to_be_bytes().to_vec();
    let mut desc = |len: u64, flags: u32| {
        p.extend_from_slice(&(len as u32).to_be_bytes());
        p.extend_from_slice(&flags.to_be_bytes());
    };
    if how == Misbehave::BitmapPastRequest {
        desc(end - offset, 1);
        desc(BITMAP_GRANULE, 1);
    } else {
        // Granule by granule, the last clipped to the answer's end.
        let stop = end.min(offset + BITMAP_ANSWER);
        let mut pos = offset;
        while pos < stop {
            let next = ((pos / BITMAP_GRANULE + 1) * BITMAP_GRANULE).min(stop);
            let dirty = (pos / BITMAP_GRANULE).is_multiple_of(2);
            desc(next - pos, dirty as u32);
            pos = next;
        }
    }
    chunk(0, REPLY_TYPE_BLOCK_STATUS, cookie, &p)
}

/// Requests waiting for replies are gathered until the client pauses
/// (nothing more for 20 ms), then answered together: the batch size is
/// how many requests the client had in flight at once.
fn transmission(
    mut s: UnixStream,
    data: &[u8],
    how: Misbehave,
    stats: &Stats,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut batch: Vec<(u16, u64, u64, u32)> = Vec::new();
    loop {
        s.set_read_timeout(if batch.is_empty() {
            None
        } else {
            Some(Duration::from_millis(20))
        })?;
        let mut h = [0u8; 28];
        match s.read_exact(&mut h) {
            Ok(()) => {
                if be32(&h) != REQUEST_MAGIC {
                    return Ok(());
                }
                let cmd = u16::from_be_bytes([h[6], h[7]]);
                if cmd == CMD_DISC {
                    return Ok(());
                }
                stats.requests.fetch_add(1, Ordering::SeqCst);
                batch.push((cmd, be64(&h[8..]), be64(&h[16..]), be32(&h[24..])));
                stats.max_in_flight.fetch_max(batch.len(), Ordering::SeqCst);
                continue;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
        for (cmd, cookie, offset, len) in batch.drain(..) {
            let end = (offset + len as u64).min(data.len() as u64);
            let reply = match cmd {
                CMD_READ => {
                    let mut p = offset.to_be_bytes().to_vec();
                    p.extend_from_slice(&data[offset as usize..end as usize]);
                    chunk(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, &p)
                }
                CMD_BLOCK_STATUS => {
                    let mut reply = Vec::new();
                    if matches!(how, Misbehave::DirtyBitmap | Misbehave::BitmapPastRequest) {
                        reply = bitmap_chunk(how, cookie, offset, end);
                    }
                    let mut p = CONTEXT_ID.to_be_bytes().to_vec();
                    p.extend_from_slice(&((end - offset) as u32).to_be_bytes());
                    p.extend_from_slice(&0u32.to_be_bytes());
                    reply.extend(chunk(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, &p));
                    reply
                }
                _ => return Ok(()),
            };
            match (how, cmd) {
                (Misbehave::SilentRead, CMD_READ) => return silence(&mut s, stop),
                (Misbehave::TrickleRead, CMD_READ) => return trickle(&mut s, &reply, stop),
                (Misbehave::BadReplyMagic, CMD_READ) => {
                    let mut bad = reply;
                    bad[..4].copy_from_slice(&0xdead_beefu32.to_be_bytes());
                    s.write_all(&bad)?;
                }
                _ => s.write_all(&reply)?,
            }
        }
    }
}
