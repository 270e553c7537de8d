//! One NBD connection in the transmission phase: requests are sent by the
//! calling threads and registered by cookie (`pending.rs`), replies are
//! read by a reader thread (`replies.rs`) that dispatches them to their
//! waiters, writing read data straight into the waiting caller's buffer.
//! Many requests can be in flight at once.
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
use super::pending::{Op, Pending, Shared, StatusReply};
use super::protocol::*;
use super::replies::{peer_gone, read_loop};
use super::transport::Split;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Requests waiting for their replies at most, per connection. The
/// reader keeps one read per digest worker in flight (16 by default), each
/// a request unless the server's maximum payload splits it.
pub const MAX_IN_FLIGHT: usize = 64;
/// Bytes of reads and writes waiting for their replies at most, per
/// connection (a single larger request may still go alone).
pub const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

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

/// A request to send.
enum Request<'a> {
    /// Into the caller's buffer at `ptr` (see [`Connection::start_read`]).
    Read {
        ptr: *mut u8,
        offset: u64,
        len: u32,
    },
    Write {
        data: &'a [u8],
        offset: u64,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
    },
    Flush,
    BlockStatus {
        offset: u64,
        len: u32,
    },
}

impl Request<'_> {
    /// The command, offset, length and payload on the wire.
    fn wire(&self) -> (u16, u64, u32, &[u8]) {
        match *self {
            Request::Read { offset, len, .. } => (CMD_READ, offset, len, &[]),
            Request::Write { data, offset } => (CMD_WRITE, offset, data.len() as u32, data),
            Request::WriteZeroes { offset, len } => (CMD_WRITE_ZEROES, offset, len, &[]),
            Request::Flush => (CMD_FLUSH, 0, 0, &[]),
            Request::BlockStatus { offset, len } => (CMD_BLOCK_STATUS, offset, len, &[]),
        }
    }

    /// Bytes it counts for in flight: data moved either way.
    fn cost(&self) -> u64 {
        match *self {
            Request::Read { len, .. } => len as u64,
            Request::Write { data, .. } => data.len() as u64,
            _ => 0,
        }
    }

    /// What the reply reader keeps of it.
    fn op(&self) -> Op {
        match *self {
            Request::Read { ptr, offset, len } => Op::Read {
                ptr,
                offset,
                len,
                covered: BTreeMap::new(),
            },
            Request::BlockStatus { .. } => Op::Status {
                result: StatusReply::default(),
            },
            Request::Write { .. } | Request::WriteZeroes { .. } | Request::Flush => Op::Plain,
        }
    }
}

impl Connection {
    /// Start the transmission phase on a negotiated transport; an error if
    /// the system will not start its reader thread (its limit on threads).
    pub fn new(split: Split, export: Export, timeout: Option<Duration>) -> io::Result<Connection> {
        let shared = Arc::new(Shared::new());
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
                .map_err(|e| {
                    let shown = format!("cannot start an NBD reader thread: {e}");
                    crate::oserror::with_context(e, shown)
                })?
        };
        Ok(Connection {
            export,
            writer: Mutex::new(split.writer),
            shutdown,
            shared,
            reader: Some(reader),
            cookie: AtomicU64::new(1),
        })
    }

    /// Send `req` under a new cookie: wait for a place in flight, register
    /// it for the reader, write it.
    fn send(&self, req: Request<'_>) -> io::Result<Ticket> {
        let cookie = self.cookie.fetch_add(1, Ordering::Relaxed);
        let (cmd, offset, len, payload) = req.wire();
        let cost = req.cost();
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
                    op: req.op(),
                    cost,
                    done: false,
                    error: None,
                },
            );
        }
        let header = request(cmd, 0, cookie, offset, len);
        let sent = {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            w.write_all(&header)
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
        self.send(Request::Read {
            ptr: buf.as_mut_ptr(),
            offset,
            len: buf.len() as u32,
        })
    }

    /// Send a write of `buf` at `offset`; the ticket is done when the
    /// server says so.
    pub fn start_write(&self, buf: &[u8], offset: u64) -> io::Result<Ticket> {
        self.send(Request::Write { data: buf, offset })
    }

    /// Send a write zeroes of `len` bytes at `offset` (the server may
    /// punch a hole: NBD_CMD_FLAG_NO_HOLE is not set).
    pub fn start_write_zeroes(&self, offset: u64, len: u32) -> io::Result<Ticket> {
        self.send(Request::WriteZeroes { offset, len })
    }

    /// Flush: every write the server completed is on stable storage.
    pub fn flush(&self) -> io::Result<()> {
        let t = self.send(Request::Flush)?;
        self.wait(t).map(|_| ())
    }

    /// Block status of `[offset, offset + len)`: each negotiated context's
    /// descriptors from `offset`, as far as the server sent them (the
    /// caller says which context it cannot do without).
    pub fn block_status(&self, offset: u64, len: u32) -> io::Result<StatusReply> {
        let t = self.send(Request::BlockStatus { offset, len })?;
        Ok(self.wait(t)?.unwrap_or_default())
    }

    /// Wait for a request: its error, or block status chunks.
    pub fn wait(&self, t: Ticket) -> io::Result<Option<StatusReply>> {
        let mut st = self.shared.lock();
        loop {
            if st.pending.get(&t.0).is_some_and(|p| p.done) {
                let p = st.pending.remove(&t.0).unwrap();
                if let Some(e) = p.error {
                    return Err(io::Error::other(e));
                }
                return Ok(match p.op {
                    Op::Status { result, .. } => Some(result),
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

/// For the `nbd_transmission` fuzz target: a hostile server's `replies`
/// to one of each request kind in flight on one connection (a read, a
/// write, a write zeroes, a block status, a flush). Bit 0 of `flags` says
/// structured replies were negotiated, bit 1 that block status was
/// (base:allocation, context 1), bit 2 a dirty bitmap (context 2). Every
/// outcome is fine but a panic, a hang or a write outside a read's buffer.
#[doc(hidden)]
pub fn fuzz_replies(replies: &[u8], flags: u8) {
    use std::io::{BufReader, Cursor, Read};
    use std::sync::Condvar;
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
        bitmap: (flags & 4 != 0).then_some(2),
        listed: Vec::new(),
        min_block: 1,
        preferred_block: 4096,
        max_payload: 1 << 20,
    };
    let conn = Connection::new(split, export, None).unwrap();
    let mut buf = vec![0u8; 4096];
    let data = vec![0x55u8; 4096];
    let mut tickets = Vec::new();
    // SAFETY: every ticket is waited for below, before `buf` is dropped.
    tickets.extend(unsafe { conn.start_read(&mut buf, 0) });
    tickets.extend(conn.start_write(&data, 4096));
    tickets.extend(conn.start_write_zeroes(8192, 4096));
    tickets.extend(conn.send(Request::BlockStatus {
        offset: 0,
        len: 1 << 20,
    }));
    tickets.extend(conn.send(Request::Flush));
    *open.0.lock().unwrap() = true;
    open.1.notify_all();
    for t in tickets {
        let _ = conn.wait(t);
    }
}
