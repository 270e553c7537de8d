//! A hostile NBD server's bytes during the handshake: the greeting, then
//! the option replies through NBD_OPT_GO (structured replies, metadata
//! contexts, infos, errors, the old NBD_OPT_EXPORT_NAME way). The first
//! byte's bit 0 says NBD_OPT_STARTTLS is asked first, bit 1 that the dirty
//! bitmap `qemu:dirty-bitmap:b` is asked for too (as
//! `NbdOptions::dirty_bitmap` does), bit 2 that bitmaps are listed
//! (NBD_OPT_LIST_META_CONTEXT). Errors are fine; panics, hangs, unbounded
//! allocations, accepted block sizes we could not honour and an export
//! accepted without the bitmap asked for are not.

/// The target's check of one input.
pub fn check(data: &[u8]) {
    if let Some((&flags, server)) = data.split_first() {
        blkimage::nbd::fuzz_handshake(server, flags);
    }
}
