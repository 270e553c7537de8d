//! Interim replies (1xx), read past as RFC 9110 (section 15.2) says a
//! client does: `100 Continue`, `102 Processing`, `103 Early Hints`... may
//! come before the reply to any request, and are not it. `101 Switching
//! Protocols` is refused: no request here asks to switch.
//!
//! Both read paths skip them by the one rule of [`start`]: `direct.rs` on
//! its own connections, ureq's through [`SkipInterim`], a layer over its
//! connections. Why a layer of our own: ureq reads past them too, but then
//! weighs the reply's head by all it holds, the body's first bytes
//! included, and refuses a 1xx followed in one read by more than 64 KiB
//! (a range's body) as "headers larger than 64 KiB".

use std::io;
use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, NextTimeout, Transport};

/// Bytes of interim replies read past before a reply at most: past it, a
/// server that sends them without end is refused.
const MAX_INTERIM: usize = 64 << 10;

/// What the bytes where a reply begins hold.
#[derive(Debug, PartialEq)]
pub(crate) enum Start {
    /// An interim reply's whole head, this many bytes: skip it.
    Interim(usize),
    /// The reply (or bytes that are no reply, which its parser refuses).
    Reply,
    /// Not yet a whole head.
    Partial,
}

/// What `input`, the bytes where a reply begins, holds; `skipped`, the bytes
/// of interim replies already read past before it, bounds them.
pub(crate) fn start(input: &[u8], skipped: usize) -> io::Result<Start> {
    let mut headers = [httparse::EMPTY_HEADER; super::reply::MAX_HEADERS];
    let mut reply = httparse::Response::new(&mut headers);
    let (n, code) = match reply.parse(input) {
        Ok(httparse::Status::Complete(n)) => (n, reply.code.unwrap_or_default()),
        // A head too long is the reader's to refuse, as any reply's.
        Ok(httparse::Status::Partial) => return Ok(Start::Partial),
        Err(_) => return Ok(Start::Reply),
    };
    match code {
        101 => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the server switched protocols (101) unasked",
        )),
        100..=199 if skipped + n > MAX_INTERIM => Err(endless()),
        100..=199 => Ok(Start::Interim(n)),
        _ => Ok(Start::Reply),
    }
}

fn endless() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "more than {} KiB of interim (1xx) replies before the reply",
            MAX_INTERIM >> 10
        ),
    )
}

/// The last layer of ureq's connections: each reply's interim replies
/// consumed from the input before ureq parses it (see the module's doc).
#[derive(Debug)]
pub(crate) struct SkipInterim;

impl Connector<Box<dyn Transport>> for SkipInterim {
    type Out = Skipping;

    fn connect(
        &self,
        _: &ConnectionDetails,
        chained: Option<Box<dyn Transport>>,
    ) -> Result<Option<Skipping>, ureq::Error> {
        Ok(chained.map(|inner| Skipping {
            inner,
            at_start: false,
            skipped: 0,
        }))
    }
}

/// A connection of ureq's whose replies come without their interim ones.
#[derive(Debug)]
pub(crate) struct Skipping {
    inner: Box<dyn Transport>,
    /// A request went out and its reply's head has not come whole yet.
    at_start: bool,
    /// Bytes of interim replies skipped before this reply.
    skipped: usize,
}

impl Transport for Skipping {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        // What comes next is a reply's first byte (ureq sends a request
        // only once the last reply was read).
        self.at_start = true;
        self.skipped = 0;
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let progress = self.inner.await_input(timeout)?;
        while self.at_start {
            match start(self.inner.buffers().input(), self.skipped)? {
                Start::Interim(n) => {
                    self.inner.buffers().input_consume(n);
                    self.skipped += n;
                }
                Start::Reply => self.at_start = false,
                Start::Partial => break,
            }
        }
        Ok(progress)
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interim_replies_are_told_apart() {
        let early = b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n";
        let reply = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1\r\n\r\nx";
        assert_eq!(start(early, 0).unwrap(), Start::Interim(early.len()));
        assert_eq!(start(reply, 0).unwrap(), Start::Reply);
        assert_eq!(start(&early[..10], 0).unwrap(), Start::Partial);
        assert_eq!(start(b"garbage\r\n\r\n", 0).unwrap(), Start::Reply);
        let e = start(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", 0).unwrap_err();
        assert!(e.to_string().contains("(101)"), "{e}");
        let e = start(early, MAX_INTERIM).unwrap_err();
        assert!(e.to_string().contains("interim (1xx) replies"), "{e}");
        assert_eq!(start(&reply[..20], MAX_INTERIM).unwrap(), Start::Partial);
    }
}
