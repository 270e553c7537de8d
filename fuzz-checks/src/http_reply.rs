//! What an HTTP server says of the bytes it sends, from untrusted bytes: a
//! `Content-Range`, an `ETag` and a `Last-Modified` value (the input's
//! first three lines), parsed and checked against a version as every range
//! reply is (`blkimage::http::fuzz_reply`). A range that parses is ordered
//! and inside its complete length and writes back to itself; an ETag that
//! parses writes back to itself; a version's own validators never look
//! changed. A panic or a hang is a bug.

/// The target's check of one input.
pub fn check(data: &[u8]) {
    blkimage::http::fuzz_reply(data);
}
