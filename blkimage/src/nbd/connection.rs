//! One NBD connection in the transmission phase: requests are sent by the
//! calling threads, replies are read by a reader thread that dispatches them
//! to their waiters by cookie, writing read data straight into the waiting
//! caller's buffer. Many requests can be in flight at once.
//!
//! Any protocol violation, a dropped connection or a timeout kills the
//! connection: every waiter gets the error, nothing hangs.
//!
//! Requests in flight are bounded in number ([`MAX_IN_FLIGHT`]) and bytes
//! ([`MAX_IN_FLIGHT_BYTES`]): a sender waits for replies beyond that, so
//! however small the server makes requests, the bookkeeping stays small.
//! With a timeout, a reply must arrive whole within it once it has begun
//! (not merely some byte per timeout), and a request may wait at most that
//! long for its reply to begin.

use super::handshake::Export;
use super::protocol::*;
use super::transport::Split;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Requests waiting for their replies at most, per connection. The
/// reader keeps one read per digest worker in flight (16 by default), each
/// a request unless the server's maximum payload splits it.
pub const MAX_IN_FLIGHT: usize = 64;
/// Bytes of reads and writes waiting for their replies at most, per
/// connection (a single larger request may still go alone).
pub const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

/// A block status descriptor: its length and base:allocation flags.
pub type Status = (u32, u32);

enum Op {
    Read {
        /// The caller's buffer, valid until the request is done or the
        /// connection is dead (the caller waits for one or the other).
        ptr: *mut u8,
        offset: u64,
        len: u32,
        /// Ranges covered by content chunks (start -> end).
        covered: BTreeMap<u64, u64>,
    },
    Status {
        offset: u64,
        result: Option<Vec<Status>>,
    },
    /// A write, write zeroes or flush: the reply says done or an error.
    Plain,
}

// SAFETY: the pointer is only written by the reader thread while its owner
// waits (see `Op::Read`).
unsafe impl Send for Op {}

struct Pending {
    op: Op,
    /// Bytes it counts for in [`MAX_IN_FLIGHT_BYTES`].
    cost: u64,
    done: bool,
    error: Option<String>,
}

struct State {
    pending: HashMap<u64, Pending>,
    /// Why the connection is gone, once it is.
    dead: Option<(io::ErrorKind, String)>,
    last_activity: Instant,
    /// Requests sent and not done, and their bytes.
    in_flight: usize,
    in_flight_bytes: u64,
}

impl State {
    /// Mark a request done (once), releasing its place in flight.
    fn complete(&mut self, cookie: u64) {
        if let Some(p) = self.pending.get_mut(&cookie)
            && !p.done
        {
            p.done = true;
            self.in_flight -= 1;
            self.in_flight_bytes -= p.cost;
        }
    }
}

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection in transmission.
pub struct Connection {
    pub export: Export,
    writer: Mutex<Box<dyn Write + Send>>,
    shutdown: Arc<dyn Fn() + Send + Sync>,
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
    cookie: AtomicU64,
}

/// A request sent, to wait for.
pub struct Ticket(u64);

impl Connection {
    /// Start the transmission phase on a negotiated transport.
    pub fn new(split: Split, export: Export, timeout: Option<Duration>) -> Connection {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: HashMap::new(),
                dead: None,
                last_activity: Instant::now(),
                in_flight: 0,
                in_flight_bytes: 0,
            }),
            cond: Condvar::new(),
        });
        let shutdown = split.shutdown.clone();
        let reader = {
            let shared = shared.clone();
            let export = export.clone();
            let mut r = split.reader;
            let shutdown = split.shutdown.clone();
            std::thread::Builder::new()
                .name("nbd-reader".into())
                .spawn(move || {
                    let e = read_loop(&mut *r, &shared, &export, timeout)
                        .err()
                        .unwrap_or_else(|| io::Error::other("connection closed"));
                    shutdown();
                    let mut st = shared.lock();
                    st.dead = Some((e.kind(), e.to_string()));
                    drop(st);
                    shared.cond.notify_all();
                })
                .expect("spawn the NBD reader thread")
        };
        Connection {
            export,
            writer: Mutex::new(split.writer),
            shutdown,
            shared,
            reader: Some(reader),
            cookie: AtomicU64::new(1),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        cookie: u64,
        op: Op,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> io::Result<Ticket> {
        let cost = match cmd {
            CMD_READ | CMD_WRITE => len as u64,
            _ => 0,
        };
        {
            let mut st = self.shared.lock();
            // Wait for a place in flight (the reader frees them).
            loop {
                if let Some((kind, msg)) = &st.dead {
                    return Err(io::Error::new(*kind, msg.clone()));
                }
                if st.in_flight == 0
                    || (st.in_flight < MAX_IN_FLIGHT
                        && st.in_flight_bytes + cost <= MAX_IN_FLIGHT_BYTES)
                {
                    break;
                }
                st = self.shared.cond.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.in_flight == 0 {
                // The wait for this reply starts now, not at the last one.
                st.last_activity = Instant::now();
            }
            st.in_flight += 1;
            st.in_flight_bytes += cost;
            st.pending.insert(
                cookie,
                Pending {
                    op,
                    cost,
                    done: false,
                    error: None,
                },
            );
        }
        let req = request(cmd, flags, cookie, offset, len);
        let sent = {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            w.write_all(&req)
                .and_then(|_| w.write_all(payload))
                .and_then(|_| w.flush())
        };
        if let Err(e) = sent {
            // The reader may still hold this request: kill the connection,
            // so that it gives every waiter up.
            (self.shutdown)();
            let _ = self.wait(Ticket(cookie));
            return Err(peer_gone(e));
        }
        Ok(Ticket(cookie))
    }

    /// Send a read of `buf.len()` bytes at `offset` into `buf`.
    ///
    /// # Safety
    /// `buf` must stay valid and untouched until [`Connection::wait`]
    /// returns for the ticket (or this call fails).
    pub unsafe fn start_read(&self, buf: &mut [u8], offset: u64) -> io::Result<Ticket> {
        let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
        let len = buf.len() as u32;
        let op = Op::Read {
            ptr: buf.as_mut_ptr(),
            offset,
            len,
            covered: BTreeMap::new(),
        };
        self.send(cookie, op, CMD_READ, 0, offset, len, &[])
    }

    /// Send a write of `buf` at `offset`; the ticket is done when the
    /// server says so.
    pub fn start_write(&self, buf: &[u8], offset: u64) -> io::Result<Ticket> {
        let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
        let len = buf.len() as u32;
        self.send(cookie, Op::Plain, CMD_WRITE, 0, offset, len, buf)
    }

    /// Send a write zeroes of `len` bytes at `offset` (the server may
    /// punch a hole: NBD_CMD_FLAG_NO_HOLE is not set).
    pub fn start_write_zeroes(&self, offset: u64, len: u32) -> io::Result<Ticket> {
        let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
        self.send(cookie, Op::Plain, CMD_WRITE_ZEROES, 0, offset, len, &[])
    }

    /// Flush: every write the server completed is on stable storage.
    pub fn flush(&self) -> io::Result<()> {
        let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
        let t = self.send(cookie, Op::Plain, CMD_FLUSH, 0, 0, 0, &[])?;
        self.wait(t).map(|_| ())
    }

    /// Block status of `[offset, offset + len)`: descriptors from `offset`.
    pub fn block_status(&self, offset: u64, len: u32) -> io::Result<Vec<Status>> {
        let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
        let op = Op::Status {
            offset,
            result: None,
        };
        let t = self.send(cookie, op, CMD_BLOCK_STATUS, 0, offset, len, &[])?;
        match self.wait(t)? {
            Some(v) => Ok(v),
            None => Err(malformed("block status without a status chunk")),
        }
    }

    /// Wait for a request: its error, or block status descriptors.
    pub fn wait(&self, t: Ticket) -> io::Result<Option<Vec<Status>>> {
        let mut st = self.shared.lock();
        loop {
            if st.pending.get(&t.0).is_some_and(|p| p.done) {
                let p = st.pending.remove(&t.0).unwrap();
                if let Some(e) = p.error {
                    return Err(io::Error::other(e));
                }
                return Ok(match p.op {
                    Op::Status { result, .. } => result,
                    Op::Read { .. } | Op::Plain => None,
                });
            }
            if let Some((kind, msg)) = &st.dead {
                let e = io::Error::new(*kind, msg.clone());
                st.pending.remove(&t.0);
                return Err(e);
            }
            st = self.shared.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A clean goodbye if the connection is still healthy.
        if self.shared.lock().dead.is_none() {
            let req = request(CMD_DISC, 0, 0, 0, 0);
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let _ = w.write_all(&req).and_then(|_| w.flush());
        }
        (self.shutdown)();
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A request waited `timeout` without its reply beginning.
fn timed_out(timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "timed out after {} s waiting for the server's reply to a request \
             (the server did not answer)",
            timeout.as_secs_f64()
        ),
    )
}

/// A reply began but did not arrive whole within `timeout`.
fn reply_timed_out(timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "timed out after {} s reading a reply from the server (it began but did \
             not arrive whole in time)",
            timeout.as_secs_f64()
        ),
    )
}

/// One reply's reads: an error once `until` has passed, so a reply that
/// trickles in fails as a silent one does. (Each read also has the
/// socket's timeout, so the bound is at most twice the timeout.)
struct Deadline<'a> {
    r: &'a mut dyn BufRead,
    until: Option<Instant>,
    timeout: Duration,
}

impl Deadline<'_> {
    fn check(&self) -> io::Result<()> {
        match self.until {
            Some(u) if Instant::now() >= u => Err(reply_timed_out(self.timeout)),
            _ => Ok(()),
        }
    }

    fn map(&self, e: io::Error) -> io::Error {
        if is_timeout(&e) {
            reply_timed_out(self.timeout)
        } else {
            e
        }
    }
}

impl io::Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        self.r.read(buf).map_err(|e| self.map(e))
    }
}

impl BufRead for Deadline<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.check()?;
        let timeout = self.timeout;
        self.r.fill_buf().map_err(|e| {
            if is_timeout(&e) {
                reply_timed_out(timeout)
            } else {
                e
            }
        })
    }
    fn consume(&mut self, n: usize) {
        self.r.consume(n)
    }
}

/// Read replies until the connection fails (the error says why).
fn read_loop(
    r: &mut dyn BufRead,
    shared: &Shared,
    export: &Export,
    timeout: Option<Duration>,
) -> io::Result<()> {
    loop {
        // Wait for the next reply without consuming anything, so that an
        // idle connection survives its read timeout.
        match r.fill_buf() {
            Ok([]) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if is_peer_gone(&e) => return Err(peer_gone(e)),
            Err(e) if is_timeout(&e) => {
                let st = shared.lock();
                let limit = timeout.unwrap_or(Duration::MAX);
                if st.in_flight == 0 || st.last_activity.elapsed() < limit {
                    continue;
                }
                return Err(timed_out(limit));
            }
            Err(e) => return Err(e),
        }
        // The reply has begun: it must end within the timeout.
        let limit = timeout.unwrap_or_default();
        let mut r = Deadline {
            r: &mut *r,
            until: timeout.map(|t| Instant::now() + t),
            timeout: limit,
        };
        let header = read_reply_header(&mut r, export.structured)?;
        shared.lock().last_activity = Instant::now();
        let handled = handle_reply(&mut r, shared, export, header);
        // Places in flight may have been freed: wake the senders too.
        shared.cond.notify_all();
        handled?;
    }
}

fn unknown_cookie(cookie: u64) -> io::Error {
    malformed(format!("reply to unknown request {cookie}"))
}

/// Handle one reply (its header read), reading its payload.
fn handle_reply(
    r: &mut dyn BufRead,
    shared: &Shared,
    export: &Export,
    header: ReplyHeader,
) -> io::Result<()> {
    let cookie = header.cookie();
    // What the request is, copied out so the lock is not held while reading.
    let (is_read, is_plain, ptr, offset, len) = {
        let st = shared.lock();
        match st.pending.get(&cookie) {
            Some(p) if !p.done => match &p.op {
                Op::Read {
                    ptr, offset, len, ..
                } => (true, false, *ptr as usize, *offset, *len),
                Op::Status { offset, .. } => (false, false, 0, *offset, 0),
                Op::Plain => (false, true, 0, 0, 0),
            },
            _ => return Err(unknown_cookie(cookie)),
        }
    };
    let finish = |error: Option<String>| {
        let mut st = shared.lock();
        if let Some(p) = st.pending.get_mut(&cookie)
            && p.error.is_none()
        {
            p.error = error;
        }
        st.complete(cookie);
    };
    match header {
        ReplyHeader::Simple { error, .. } => {
            if error != 0 {
                finish(Some(error_name(error)));
            } else if is_read {
                if export.structured {
                    return Err(malformed("simple reply to a read"));
                }
                // SAFETY: the waiter keeps `len` bytes at `ptr` valid (Op::Read).
                let buf = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len as usize) };
                read_full(r, buf)?;
                finish(None);
            } else if is_plain {
                finish(None);
            } else {
                return Err(malformed("simple reply without error to block status"));
            }
        }
        ReplyHeader::Chunk {
            flags,
            kind,
            len: plen,
            ..
        } => {
            let mut err = None;
            if kind == REPLY_TYPE_OFFSET_DATA {
                if !is_read {
                    return Err(malformed("data chunk in a reply to no read"));
                }
                if plen < 9 {
                    return Err(malformed("short data chunk"));
                }
                let mut o = [0u8; 8];
                read_full(r, &mut o)?;
                let at = u64::from_be_bytes(o);
                let n = plen - 8;
                let rel = claim(shared, cookie, offset, len, at, n)?;
                // SAFETY: as above; `claim` checked the range is inside the request.
                let buf = unsafe {
                    std::slice::from_raw_parts_mut((ptr as *mut u8).add(rel), n as usize)
                };
                read_full(r, buf)?;
            } else {
                match read_chunk(r, kind, plen)? {
                    Chunk::None => {
                        if flags & REPLY_FLAG_DONE == 0 {
                            return Err(malformed("NONE chunk without the done flag"));
                        }
                    }
                    Chunk::Hole { offset: at, len: n } => {
                        if !is_read {
                            return Err(malformed("hole chunk in a reply to no read"));
                        }
                        let rel = claim(shared, cookie, offset, len, at, n)?;
                        // SAFETY: as above.
                        unsafe { std::ptr::write_bytes((ptr as *mut u8).add(rel), 0, n as usize) };
                    }
                    Chunk::BlockStatus { context, extents } => {
                        if is_read || is_plain {
                            return Err(malformed(
                                "block status chunk in a reply to no block status",
                            ));
                        }
                        if Some(context) != export.allocation {
                            return Err(malformed(format!("unknown metadata context {context}")));
                        }
                        let mut st = shared.lock();
                        let p = st.pending.get_mut(&cookie).unwrap();
                        if let Op::Status { result, .. } = &mut p.op {
                            if result.is_some() {
                                return Err(malformed("two block status chunks"));
                            }
                            *result = Some(extents);
                        }
                    }
                    Chunk::Error {
                        code,
                        message,
                        offset: at,
                    } => {
                        let mut e = error_name(code);
                        if let Some(at) = at {
                            e = format!("{e} at offset {at}");
                        }
                        if !message.is_empty() {
                            e = format!("{e}: {message}");
                        }
                        err = Some(e);
                    }
                }
            }
            if let Some(e) = err {
                let mut st = shared.lock();
                if let Some(p) = st.pending.get_mut(&cookie)
                    && p.error.is_none()
                {
                    p.error = Some(e);
                }
            }
            if flags & REPLY_FLAG_DONE != 0 {
                let mut st = shared.lock();
                let p = st.pending.get_mut(&cookie).unwrap();
                if p.error.is_none()
                    && let Op::Read { covered, .. } = &p.op
                {
                    let total: u64 = covered.iter().map(|(s, e)| e - s).sum();
                    if total != len as u64 {
                        return Err(malformed(format!(
                            "read reply covers {total} of {len} bytes"
                        )));
                    }
                }
                st.complete(cookie);
            }
        }
    }
    Ok(())
}

/// Record that a content chunk covers `[at, at + n)` of a read of `len`
/// bytes at `offset`: it must lie inside the request and overlap nothing
/// covered before. Returns its offset in the buffer.
fn claim(
    shared: &Shared,
    cookie: u64,
    offset: u64,
    len: u32,
    at: u64,
    n: u32,
) -> io::Result<usize> {
    let end = at
        .checked_add(n as u64)
        .ok_or_else(|| malformed("chunk offset overflows"))?;
    if at < offset || end > offset + len as u64 {
        return Err(malformed(format!(
            "chunk [{at}, {end}) outside the request [{offset}, {})",
            offset + len as u64
        )));
    }
    let mut st = shared.lock();
    let p = st
        .pending
        .get_mut(&cookie)
        .ok_or_else(|| unknown_cookie(cookie))?;
    if let Op::Read { covered, .. } = &mut p.op {
        let before = covered.range(..end).next_back();
        if before.is_some_and(|(_, &e)| e > at) {
            return Err(malformed("overlapping chunks"));
        }
        covered.insert(at, end);
    }
    Ok((at - offset) as usize)
}

/// A server that dies mid-transfer shows as a reset or a broken pipe
/// depending on timing; say what happened the same way in both cases.
fn is_peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

fn peer_gone(e: io::Error) -> io::Error {
    if is_peer_gone(&e) {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the server closed the connection ({e})"),
        )
    } else {
        e
    }
}

/// For the `nbd_transmission` fuzz target: a hostile server's `replies`
/// to one of each request kind in flight on one connection (a read, a
/// write, a write zeroes, a block status, a flush). Bit 0 of `flags` says
/// structured replies were negotiated, bit 1 that block status was. Every
/// outcome is fine but a panic, a hang or a write outside a read's buffer.
#[cfg(feature = "fuzzing")]
pub fn fuzz_replies(replies: &[u8], flags: u8) {
    use std::io::{BufReader, Cursor, Read};
    // The replies are released only once every request is registered, so
    // each run is deterministic.
    struct Gated {
        inner: Cursor<Vec<u8>>,
        open: Arc<(Mutex<bool>, Condvar)>,
    }
    impl Read for Gated {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            let (m, c) = &*self.open;
            let mut open = m.lock().unwrap();
            while !*open {
                open = c.wait(open).unwrap();
            }
            self.inner.read(b)
        }
    }
    let open = Arc::new((Mutex::new(false), Condvar::new()));
    let split = Split {
        reader: Box::new(BufReader::new(Gated {
            inner: Cursor::new(replies.to_vec()),
            open: open.clone(),
        })),
        writer: Box::new(io::sink()),
        shutdown: Arc::new(|| {}),
    };
    let export = Export {
        size: 1 << 20,
        flags: 0,
        structured: flags & 1 != 0,
        allocation: (flags & 2 != 0).then_some(1),
        min_block: 1,
        preferred_block: 4096,
        max_payload: 1 << 20,
    };
    let conn = Connection::new(split, export, None);
    let mut buf = vec![0u8; 4096];
    let data = vec![0x55u8; 4096];
    let mut tickets = Vec::new();
    // SAFETY: every ticket is waited for below, before `buf` is dropped.
    tickets.extend(unsafe { conn.start_read(&mut buf, 0) });
    tickets.extend(conn.start_write(&data, 4096));
    tickets.extend(conn.start_write_zeroes(8192, 4096));
    let cookie = conn.cookie.fetch_add(1, Ordering::Relaxed);
    let status = Op::Status {
        offset: 0,
        result: None,
    };
    tickets.extend(conn.send(cookie, status, CMD_BLOCK_STATUS, 0, 0, 1 << 20, &[]));
    let cookie = conn.cookie.fetch_add(1, Ordering::Relaxed);
    tickets.extend(conn.send(cookie, Op::Plain, CMD_FLUSH, 0, 0, 0, &[]));
    *open.0.lock().unwrap() = true;
    open.1.notify_all();
    for t in tickets {
        let _ = conn.wait(t);
    }
}
