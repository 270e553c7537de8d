//! A hostile NBD server's replies to requests in flight on one connection
//! (a read, a write, a write zeroes, a block status, a flush): the reply
//! dispatch, not just the parsing (nbd_reply). The first byte says what was
//! negotiated: structured replies (bit 0), base:allocation (bit 1), a dirty
//! bitmap's context (bit 2). Errors are fine; panics, hangs and writes
//! outside a read's buffer (the sanitizer) are not.

/// The target's check of one input.
pub fn check(data: &[u8]) {
    if let Some((&flags, replies)) = data.split_first() {
        blkimage::nbd::fuzz_replies(replies, flags);
    }
}
