//! NBD replies from a hostile server, as bytes: option replies, then
//! transmission reply headers and chunk payloads, parsed until an error.
//! Errors are fine; panics, hangs and unbounded allocations are not.

use blkimage::nbd::protocol::*;
use std::io::Read;

/// The target's check of one input.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut r: &[u8] = rest;
    if mode & 1 == 0 {
        // Handshake: option replies to NBD_OPT_GO.
        for _ in 0..64 {
            let Ok(reply) = read_option_reply(&mut r, OPT_GO) else {
                return;
            };
            let _ = reply.error_text();
            let _ = parse_info(&reply.data);
            let _ = parse_meta_context(&reply.data);
        }
        return;
    }
    // Transmission: headers and chunks.
    for _ in 0..1024 {
        let Ok(h) = read_reply_header(&mut r, mode & 2 != 0) else {
            return;
        };
        if let ReplyHeader::Chunk { kind, len, .. } = h {
            if kind == REPLY_TYPE_OFFSET_DATA {
                // The client reads data into its buffer; skip it here.
                let mut sink = std::io::sink();
                if std::io::copy(&mut (&mut r).take(len as u64), &mut sink).is_err() {
                    return;
                }
                continue;
            }
            if read_chunk(&mut r, kind, len).is_err() {
                return;
            }
        }
    }
}
