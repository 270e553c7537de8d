//! A hostile NBD server's replies to requests in flight on one connection
//! (a read, a write, a write zeroes, a block status, a flush): the reply
//! dispatch, not just the parsing (nbd_reply). Errors are fine; panics,
//! hangs and writes outside a read's buffer (the sanitizer) are not.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&flags, replies)) = data.split_first() {
        blkimage::nbd::fuzz_replies(replies, flags);
    }
});
