//! The reader side of an NBD connection: one thread reads replies, each
//! bounded by the timeout once it has begun, and hands each to its waiter
//! by cookie: a simple reply, or structured chunks, one function per chunk
//! type. Anything the protocol does not allow kills the connection.

use super::handshake::Export;
use super::pending::{Op, Shared, State, Status};
use super::protocol::*;
use std::io::{self, BufRead};
use std::time::{Duration, Instant};

pub(super) fn is_timeout(e: &io::Error) -> bool {
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
pub(super) fn read_loop(
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

/// What a reply answers, copied out of the pending request so that no lock
/// is held while the payload is read.
enum Asked {
    /// A read of `len` bytes at `offset` into the waiter's buffer at `ptr`.
    Read { ptr: usize, offset: u64, len: u32 },
    /// A block status query from `offset`.
    Status,
    /// A write, write zeroes or flush: only done or an error.
    Plain,
}

fn asked(shared: &Shared, cookie: u64) -> io::Result<Asked> {
    let st = shared.lock();
    match st.pending.get(&cookie) {
        Some(p) if !p.done => Ok(match &p.op {
            Op::Read {
                ptr, offset, len, ..
            } => Asked::Read {
                ptr: *ptr as usize,
                offset: *offset,
                len: *len,
            },
            Op::Status { .. } => Asked::Status,
            Op::Plain => Asked::Plain,
        }),
        _ => Err(unknown_cookie(cookie)),
    }
}

/// Handle one reply (its header read), reading its payload.
fn handle_reply(
    r: &mut dyn BufRead,
    shared: &Shared,
    export: &Export,
    header: ReplyHeader,
) -> io::Result<()> {
    let cookie = header.cookie();
    let asked = asked(shared, cookie)?;
    match header {
        ReplyHeader::Simple { error, .. } => simple_reply(r, shared, export, cookie, &asked, error),
        ReplyHeader::Chunk {
            flags, kind, len, ..
        } => {
            let error = if kind == REPLY_TYPE_OFFSET_DATA {
                data_chunk(r, shared, cookie, &asked, len)?;
                None
            } else {
                match read_chunk(r, kind, len)? {
                    Chunk::None => {
                        if flags & REPLY_FLAG_DONE == 0 {
                            return Err(malformed("NONE chunk without the done flag"));
                        }
                        None
                    }
                    Chunk::Hole { offset, len } => {
                        hole_chunk(shared, cookie, &asked, offset, len)?;
                        None
                    }
                    Chunk::BlockStatus { context, extents } => {
                        status_chunk(shared, export, cookie, &asked, context, extents)?;
                        None
                    }
                    Chunk::Error {
                        code,
                        message,
                        offset,
                    } => Some(error_text(code, &message, offset)),
                }
            };
            if let Some(e) = error {
                set_error(&mut shared.lock(), cookie, e);
            }
            if flags & REPLY_FLAG_DONE != 0 {
                last_chunk(shared, cookie, &asked)?;
            }
            Ok(())
        }
    }
}

/// The request's first error stays: later chunks do not replace it.
fn set_error(st: &mut State, cookie: u64, error: String) {
    if let Some(p) = st.pending.get_mut(&cookie)
        && p.error.is_none()
    {
        p.error = Some(error);
    }
}

/// A simple reply: an error, a read's data (without structured replies),
/// or done.
fn simple_reply(
    r: &mut dyn BufRead,
    shared: &Shared,
    export: &Export,
    cookie: u64,
    asked: &Asked,
    error: u32,
) -> io::Result<()> {
    if error != 0 {
        let mut st = shared.lock();
        set_error(&mut st, cookie, error_name(error));
        st.complete(cookie);
        return Ok(());
    }
    match *asked {
        Asked::Read { ptr, len, .. } => {
            if export.structured {
                return Err(malformed("simple reply to a read"));
            }
            // SAFETY: the waiter keeps `len` bytes at `ptr` valid (Op::Read).
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len as usize) };
            read_full(r, buf)?;
        }
        Asked::Plain => {}
        Asked::Status => return Err(malformed("simple reply without error to block status")),
    }
    shared.lock().complete(cookie);
    Ok(())
}

/// NBD_REPLY_TYPE_OFFSET_DATA: read data straight into the waiter's buffer.
fn data_chunk(
    r: &mut dyn BufRead,
    shared: &Shared,
    cookie: u64,
    asked: &Asked,
    chunk_len: u32,
) -> io::Result<()> {
    let Asked::Read { ptr, offset, len } = *asked else {
        return Err(malformed("data chunk in a reply to no read"));
    };
    if chunk_len < 9 {
        return Err(malformed("short data chunk"));
    }
    let mut o = [0u8; 8];
    read_full(r, &mut o)?;
    let at = u64::from_be_bytes(o);
    let n = chunk_len - 8;
    let rel = claim(shared, cookie, offset, len, at, n)?;
    // SAFETY: as in simple_reply; `claim` checked the range is inside the request.
    let buf = unsafe { std::slice::from_raw_parts_mut((ptr as *mut u8).add(rel), n as usize) };
    read_full(r, buf)
}

/// NBD_REPLY_TYPE_OFFSET_HOLE: zeros into the waiter's buffer.
fn hole_chunk(shared: &Shared, cookie: u64, asked: &Asked, at: u64, n: u32) -> io::Result<()> {
    let Asked::Read { ptr, offset, len } = *asked else {
        return Err(malformed("hole chunk in a reply to no read"));
    };
    let rel = claim(shared, cookie, offset, len, at, n)?;
    // SAFETY: as in data_chunk.
    unsafe { std::ptr::write_bytes((ptr as *mut u8).add(rel), 0, n as usize) };
    Ok(())
}

/// NBD_REPLY_TYPE_BLOCK_STATUS: the one status chunk of a block status
/// for one of the negotiated contexts.
fn status_chunk(
    shared: &Shared,
    export: &Export,
    cookie: u64,
    asked: &Asked,
    context: u32,
    extents: Vec<Status>,
) -> io::Result<()> {
    if !matches!(asked, Asked::Status) {
        return Err(malformed(
            "block status chunk in a reply to no block status",
        ));
    }
    let mut st = shared.lock();
    let p = st.pending.get_mut(&cookie).unwrap();
    if let Op::Status { result, .. } = &mut p.op {
        // The ids were checked distinct at the handshake.
        let slot = if Some(context) == export.allocation {
            &mut result.allocation
        } else if Some(context) == export.bitmap {
            &mut result.bitmap
        } else {
            return Err(malformed(format!("unknown metadata context {context}")));
        };
        if slot.is_some() {
            return Err(malformed(format!(
                "two block status chunks for metadata context {context}"
            )));
        }
        *slot = Some(extents);
    }
    Ok(())
}

/// An error chunk as the waiter's error: its name, offset and message.
fn error_text(code: u32, message: &str, offset: Option<u64>) -> String {
    let mut e = error_name(code);
    if let Some(at) = offset {
        e = format!("{e} at offset {at}");
    }
    if !message.is_empty() {
        e = format!("{e}: {message}");
    }
    e
}

/// The chunk with the done flag: a read without an error must be covered
/// whole; the request is done.
fn last_chunk(shared: &Shared, cookie: u64, asked: &Asked) -> io::Result<()> {
    let mut st = shared.lock();
    let p = st.pending.get_mut(&cookie).unwrap();
    if let (None, Op::Read { covered, .. }, Asked::Read { len, .. }) = (&p.error, &p.op, asked) {
        let total: u64 = covered.iter().map(|(s, e)| e - s).sum();
        if total != *len as u64 {
            return Err(malformed(format!(
                "read reply covers {total} of {len} bytes"
            )));
        }
    }
    st.complete(cookie);
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

pub(super) fn peer_gone(e: io::Error) -> io::Error {
    if is_peer_gone(&e) {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the server closed the connection ({e})"),
        )
    } else {
        e
    }
}
