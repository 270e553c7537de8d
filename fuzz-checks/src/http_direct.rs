//! A hostile HTTP server's whole reply to a range asked on a connection
//! of our own (`blkimage::http::fuzz_direct`: the reply sent on a real
//! loopback socket, then the connection closed): its head parsed
//! (httparse), its status and headers checked as every range reply is,
//! its framing (Content-Length, chunked, a second length, `Connection:
//! close`) and its body read into the caller's buffer. A panic, a hang,
//! or a range taken whose bytes are not in the reply is a bug.

/// The target's check of one input.
pub fn check(data: &[u8]) {
    blkimage::http::fuzz_direct(data);
}
