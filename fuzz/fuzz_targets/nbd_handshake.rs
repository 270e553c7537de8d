//! A hostile NBD server's bytes during the handshake: the greeting, then
//! the option replies through NBD_OPT_GO (structured replies, metadata
//! contexts, infos, errors, the old NBD_OPT_EXPORT_NAME way). The first
//! byte's bit 0 says NBD_OPT_STARTTLS is asked first. Errors are fine;
//! panics, hangs, unbounded allocations and accepted block sizes we could
//! not honour are not.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&flags, server)) = data.split_first() {
        blkimage::nbd::fuzz_handshake(server, flags);
    }
});
