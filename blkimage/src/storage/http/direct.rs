//! Ranges of a plain HTTP file read from the socket straight into the
//! buffer the digest workers hash.
//!
//! Why by hand: ureq, like hyper, reads every body into a buffer of its
//! own and copies it out, a second copy of every byte after the kernel's
//! (13% of the CPU of `blksum URL` over loopback, in perf). No client
//! crate reads a body into the caller's buffer, so a range is asked here
//! on a keep-alive connection of our own: a GET with the headers ureq
//! would send, the reply's head parsed by httparse (ureq's own parser),
//! its status and headers checked as ureq's are (`Http::check_reply`),
//! and a body of exactly its Content-Length read into the buffer. What a
//! range does not need is left to ureq, which asks again: HTTPS (rustls
//! decrypts into a buffer of its own anyway), a proxy, a reply framed
//! otherwise (chunked, or ended by closing). Interim (1xx) replies before
//! the reply are read past here as there (`interim.rs`).

use super::Headers;
use super::client::{self, Client, Fail, read_body};
use super::interim::{self, Start};
use super::reply::MAX_HEADERS;
use super::url::HttpUrl;
use std::io::{self, Read as _, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The largest reply head taken, as ureq's limit.
const MAX_HEAD: usize = 64 << 10;
/// Idle connections kept: one per reading thread, as ureq's pool.
const POOL: usize = 256;

/// How a range went.
#[derive(Debug, PartialEq)]
pub(crate) enum Read {
    /// The buffer holds the range.
    Done,
    /// The reply is not one read here (its framing): ask ureq.
    Declined,
}

/// Plain-HTTP range requests for one URL, on connections of our own.
pub(crate) struct Direct {
    url: HttpUrl,
    /// The request's line and fixed headers, without its last blank line.
    request: String,
    timeout: Option<Duration>,
    idle: Mutex<Vec<TcpStream>>,
}

impl Direct {
    /// Requests for `url` with what `client` sends (its headers checked
    /// when it was made): `None` for HTTPS or a proxy.
    pub(crate) fn new(client: &Client, url: &HttpUrl) -> Option<Direct> {
        if url.is_https() || client.proxied() {
            return None;
        }
        let mut request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nAccept-Encoding: identity\r\n",
            url.request_target(),
            url.host_header(),
            client::USER_AGENT
        );
        for (name, value) in client.users_headers(url) {
            request += &format!("{name}: {value}\r\n");
        }
        Some(Direct {
            url: url.clone(),
            request,
            timeout: client.timeout(),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// GET `buf.len()` bytes with the `extra` headers (the range and its
    /// condition) into `buf`, all of it by `deadline`. `check` judges the
    /// reply's status and headers before its body is read.
    pub(crate) fn range(
        &self,
        extra: &[(&str, String)],
        buf: &mut [u8],
        deadline: Option<Instant>,
        check: impl FnOnce(u16, Headers) -> Result<(), Fail>,
    ) -> Result<Read, Fail> {
        let mut request = self.request.clone();
        for (name, value) in extra {
            request += &format!("{name}: {value}\r\n");
        }
        request += "\r\n";
        let (stream, head, filled) = self.exchange(&request, deadline)?;
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut reply = httparse::Response::new(&mut headers);
        let at = match reply.parse(&head[..filled]) {
            Ok(httparse::Status::Complete(at)) => at,
            // ask() read until the head was complete or refused.
            _ => unreachable!("a reply head parsed twice differently"),
        };
        let h = |name: &str| header(&reply, name);
        check(reply.code.unwrap_or_default(), &h)?;
        if body_length(&reply)?.is_none() {
            return Ok(Read::Declined);
        }
        let keep = reply.version == Some(1)
            && !h("connection")
                .is_some_and(|c| c.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
        let rest = &head[at..filled];
        if rest.len() > buf.len() {
            return Err(Fail::final_with(
                io::ErrorKind::InvalidData,
                format!("the reply is longer than the {} bytes asked for", buf.len()),
            ));
        }
        let mut body = Body {
            rest,
            stream: &stream,
            left: (buf.len() - rest.len()) as u64,
            timeout: self.timeout,
        };
        read_body(&mut body, buf, deadline, self.timeout)?;
        if keep && reusable(&stream) {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < POOL {
                idle.push(stream);
            }
        }
        Ok(Read::Done)
    }

    /// Send `request` on a kept connection, or a new one, and read its
    /// reply's head: the connection, the bytes read and how many.
    fn exchange(
        &self,
        request: &str,
        deadline: Option<Instant>,
    ) -> Result<(TcpStream, Vec<u8>, usize), Fail> {
        let mut head = vec![0u8; 8 << 10];
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let (stream, filled) = match pooled {
            // A kept connection the server has since closed fails before
            // any byte of a reply: ask once more on a new one.
            Some(s) => match self.ask(&s, request, &mut head, deadline) {
                Err(Asked::Unanswered(_)) => self.ask_new(request, &mut head, deadline)?,
                other => (s, other?),
            },
            None => self.ask_new(request, &mut head, deadline)?,
        };
        Ok((stream, head, filled))
    }

    /// [`Direct::ask`] on a new connection.
    fn ask_new(
        &self,
        request: &str,
        head: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<(TcpStream, usize), Fail> {
        let stream = self.connect()?;
        let filled = self.ask(&stream, request, head, deadline)?;
        Ok((stream, filled))
    }

    /// A connection to the URL's host, with the timeout on every read and
    /// write.
    fn connect(&self) -> Result<TcpStream, Fail> {
        let to = self.url.authority();
        let addrs = self.url.socket_addrs().map_err(|_| {
            let e = io::Error::new(io::ErrorKind::NotFound, "the host name does not resolve");
            client::cannot_connect(&to, e)
        })?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the host name has no address");
        for addr in addrs {
            let stream = match self.timeout {
                Some(t) => TcpStream::connect_timeout(&addr, t),
                None => TcpStream::connect(addr),
            };
            let stream = stream.and_then(|s| {
                s.set_read_timeout(self.timeout)?;
                s.set_write_timeout(self.timeout)?;
                s.set_nodelay(true)?;
                Ok(s)
            });
            match stream {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(match last.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                Fail::Again(self.timed_out(&format!("cannot connect to {to}")))
            }
            _ => client::cannot_connect(&to, last),
        })
    }

    /// Send `request` on `stream` and read the reply's head into `head`
    /// (and whatever of its body came with it): how many bytes were read.
    fn ask(
        &self,
        mut stream: &TcpStream,
        request: &str,
        head: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<usize, Asked> {
        stream
            .write_all(request.as_bytes())
            .map_err(|e| Asked::Unanswered(self.io(e)))?;
        // Bytes read and held in `head`; of interim replies read past.
        let (mut filled, mut skipped) = (0, 0);
        loop {
            if filled == head.len() {
                if head.len() >= MAX_HEAD {
                    return Err(Asked::Failed(Fail::final_with(
                        io::ErrorKind::InvalidData,
                        "the server's reply headers are larger than 64 KiB".into(),
                    )));
                }
                head.resize((head.len() * 2).min(MAX_HEAD), 0);
            }
            let n = match stream.read(&mut head[filled..]) {
                Ok(0) if filled == 0 && skipped == 0 => {
                    return Err(Asked::Unanswered(Fail::Again(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection without a reply",
                    ))));
                }
                Ok(0) => {
                    return Err(Asked::Failed(Fail::Again(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection within its reply's head",
                    ))));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if filled == 0 && skipped == 0 => {
                    return Err(Asked::Unanswered(self.io(e)));
                }
                Err(e) => return Err(Asked::Failed(self.io(e))),
            };
            filled += n;
            while let Start::Interim(n) = interim::start(&head[..filled], skipped)
                .map_err(|e| Asked::Failed(Fail::Final(e)))?
            {
                head.copy_within(n..filled, 0);
                filled -= n;
                skipped += n;
            }
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            match httparse::Response::new(&mut headers).parse(&head[..filled]) {
                Ok(httparse::Status::Complete(_)) => return Ok(filled),
                Ok(httparse::Status::Partial) => {}
                // On a kept connection, perhaps bytes a server sent after
                // an earlier reply's length: asked again on a new one.
                Err(e) => {
                    return Err(Asked::Unanswered(Fail::final_with(
                        io::ErrorKind::InvalidData,
                        format!("HTTP: a reply that does not parse ({e})"),
                    )));
                }
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(Asked::Failed(Fail::Again(self.timed_out("the reply"))));
            }
        }
    }

    /// An I/O error of a request as a [`Fail`]: a read or write timeout
    /// in words.
    fn io(&self, e: io::Error) -> Fail {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                Fail::Again(self.timed_out("the server"))
            }
            _ => client::io_fail(e, self.timeout),
        }
    }

    fn timed_out(&self, what: &str) -> io::Error {
        timed_out(what, self.timeout)
    }
}

fn timed_out(what: &str, timeout: Option<Duration>) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "{what}: no answer within {} seconds",
            timeout.unwrap_or_default().as_secs_f64()
        ),
    )
}

/// The first value of a reply's header `name`, if it is text.
fn header<'a>(reply: &httparse::Response<'_, 'a>, name: &str) -> Option<&'a str> {
    reply
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .and_then(|h| std::str::from_utf8(h.value).ok())
}

/// The body's length as the reply gives it, in digits; `None` if the
/// reply is framed otherwise (chunked, or ended by closing), which ureq
/// reads. Two lengths that differ, or one that is not a number, are
/// refused (`Http::check_reply` refused a length in words that is not the
/// range's; this refuses what it could not read: not text, not digits).
fn body_length<'a>(reply: &httparse::Response<'_, 'a>) -> Result<Option<&'a [u8]>, Fail> {
    let mut lengths = reply
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| h.value);
    let length = lengths.next();
    if lengths.any(|v| Some(v) != length) {
        return Err(Fail::final_with(
            io::ErrorKind::InvalidData,
            "a reply with two Content-Lengths that differ".into(),
        ));
    }
    let Some(length) = length.filter(|_| header(reply, "transfer-encoding").is_none()) else {
        return Ok(None);
    };
    if length.is_empty() || !length.iter().all(u8::is_ascii_digit) {
        return Err(Fail::final_with(
            io::ErrorKind::InvalidData,
            format!(
                "a reply whose Content-Length is not a number: '{}'",
                length.escape_ascii()
            ),
        ));
    }
    Ok(Some(length))
}

/// Whether `stream` may take another request: open, and holding nothing
/// (bytes past a reply's length would be taken for the next reply's
/// head), seen without waiting.
fn reusable(stream: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: a read of at most one byte into `byte`, which outlives it.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

/// Why [`Direct::ask`] got no reply head.
enum Asked {
    /// Not a byte of a reply: on a kept connection, the server closed it.
    Unanswered(Fail),
    /// The reply began and failed.
    Failed(Fail),
}

impl From<Asked> for Fail {
    fn from(a: Asked) -> Fail {
        match a {
            Asked::Unanswered(f) | Asked::Failed(f) => f,
        }
    }
}

/// A reply's body: the part read with its head, then the socket, never
/// past its length (so a kept connection holds nothing of it).
struct Body<'a> {
    rest: &'a [u8],
    stream: &'a TcpStream,
    left: u64,
    timeout: Option<Duration>,
}

impl io::Read for Body<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.rest.is_empty() {
            let n = self.rest.len().min(buf.len());
            buf[..n].copy_from_slice(&self.rest[..n]);
            self.rest = &self.rest[n..];
            return Ok(n);
        }
        let want = usize::try_from(self.left).map_or(buf.len(), |l| l.min(buf.len()));
        if want == 0 {
            return Ok(0);
        }
        match self.stream.read(&mut buf[..want]) {
            Ok(n) => {
                self.left -= n as u64;
                Ok(n)
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock) => {
                Err(timed_out("the body", self.timeout))
            }
            Err(e) => Err(e),
        }
    }
}
