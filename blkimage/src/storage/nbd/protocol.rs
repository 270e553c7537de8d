//! NBD wire structures (doc/proto.md of the NBD project): constants,
//! request and option encoding, and strict parsing of what the server sends.
//!
//! Parsing never trusts a length before bounding it, and reads from any
//! [`Read`], so the parser can be fed plain bytes (tests, fuzzing).

use std::io::{self, Read};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Structured reply chunks.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// base:allocation status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

pub const BASE_ALLOCATION: &str = "base:allocation";

// qemu:dirty-bitmap:NAME status flags (QEMU's docs/interop/nbd.txt).
pub const STATE_DIRTY: u32 = 1 << 0;

/// QEMU's dirty bitmap contexts: this prefix and the bitmap's name. The
/// prefix alone lists them all (NBD_OPT_LIST_META_CONTEXT).
pub const DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";

/// The largest option reply payload accepted (names, messages, infos).
pub const MAX_OPTION_REPLY: u32 = 64 << 10;
/// The largest block status chunk: 2^20 descriptors, as the spec allows.
pub const MAX_BLOCK_STATUS: u32 = 4 + 8 * (1 << 20);
/// The longest error message (the spec's string limit).
pub const MAX_MESSAGE: usize = 4096;
/// Default maximum payload when the server does not say (the spec's 32 MiB).
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// An error for bytes that break the protocol.
pub fn malformed(msg: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed reply from the server: {}", msg.into()),
    )
}

/// Read exactly `buf.len()` bytes; a clean end of stream is reported as a
/// dropped connection.
pub fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )
        } else {
            e
        }
    })
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// An option request: IHAVEOPT, option, length, data.
pub fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// NBD_OPT_GO data: the export name and the information requested.
pub fn go_data(export: &str, infos: &[u16]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(export.len() as u32).to_be_bytes());
    v.extend_from_slice(export.as_bytes());
    v.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

/// NBD_OPT_SET_META_CONTEXT data.
pub fn meta_context_data(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(export.len() as u32).to_be_bytes());
    v.extend_from_slice(export.as_bytes());
    v.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        v.extend_from_slice(&(q.len() as u32).to_be_bytes());
        v.extend_from_slice(q.as_bytes());
    }
    v
}

/// A transmission request's header (a write's payload follows it).
pub fn request(cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut b = [0u8; 28];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&cmd.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..28].copy_from_slice(&len.to_be_bytes());
    b
}

/// A reply to an option (the one it answers is checked on reading), with
/// its (bounded) payload.
#[derive(Debug)]
pub struct OptionReply {
    pub kind: u32,
    pub data: Vec<u8>,
}

impl OptionReply {
    pub fn is_error(&self) -> bool {
        self.kind & (1 << 31) != 0
    }

    /// A readable description of an error reply.
    pub fn error_text(&self) -> String {
        let name = match self.kind.wrapping_sub(1 << 31) {
            1 => "unsupported",
            2 => "denied by policy",
            3 => "invalid",
            4 => "not supported on the server's platform",
            5 => "TLS required",
            6 => "unknown export",
            7 => "server shutting down",
            8 => "block size negotiation required",
            9 => "too big",
            10 => "extended headers required",
            _ => "error",
        };
        let msg = String::from_utf8_lossy(&self.data);
        let msg = msg.trim();
        if msg.is_empty() {
            name.to_string()
        } else {
            format!("{name}: {msg}")
        }
    }
}

/// Read one option reply to `expected`.
pub fn read_option_reply(r: &mut dyn Read, expected: u32) -> io::Result<OptionReply> {
    let mut h = [0u8; 20];
    read_full(r, &mut h)?;
    if be64(&h) != OPT_REPLY_MAGIC {
        return Err(malformed("bad option reply magic"));
    }
    let (option, kind, len) = (be32(&h[8..]), be32(&h[12..]), be32(&h[16..]));
    if option != expected {
        return Err(malformed(format!(
            "reply to option {option}, expected {expected}"
        )));
    }
    if len > MAX_OPTION_REPLY {
        return Err(malformed(format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    read_full(r, &mut data)?;
    Ok(OptionReply { kind, data })
}

/// What an NBD_REP_INFO says.
#[derive(Debug, PartialEq, Eq)]
pub enum Info {
    Export { size: u64, flags: u16 },
    BlockSize { min: u32, preferred: u32, max: u32 },
    Other,
}

pub fn parse_info(d: &[u8]) -> io::Result<Info> {
    if d.len() < 2 {
        return Err(malformed("short NBD_REP_INFO"));
    }
    match be16(d) {
        INFO_EXPORT if d.len() == 12 => Ok(Info::Export {
            size: be64(&d[2..]),
            flags: be16(&d[10..]),
        }),
        INFO_BLOCK_SIZE if d.len() == 14 => {
            let (min, preferred, max) = (be32(&d[2..]), be32(&d[6..]), be32(&d[10..]));
            if !min.is_power_of_two()
                || min > 65536
                || !preferred.is_power_of_two()
                || preferred < min
                || max < min
            {
                return Err(malformed(format!(
                    "block sizes min {min}, preferred {preferred}, max {max}"
                )));
            }
            Ok(Info::BlockSize {
                min,
                preferred,
                max,
            })
        }
        INFO_EXPORT | INFO_BLOCK_SIZE => Err(malformed("NBD_REP_INFO of a wrong length")),
        _ => Ok(Info::Other),
    }
}

/// An NBD_REP_META_CONTEXT: the context id and its name.
pub fn parse_meta_context(d: &[u8]) -> io::Result<(u32, String)> {
    if d.len() < 4 {
        return Err(malformed("short NBD_REP_META_CONTEXT"));
    }
    let name = std::str::from_utf8(&d[4..])
        .map_err(|_| malformed("metadata context name is not UTF-8"))?;
    Ok((be32(d), name.to_string()))
}

/// The fixed part of a transmission reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple {
        error: u32,
        cookie: u64,
    },
    Chunk {
        flags: u16,
        kind: u16,
        cookie: u64,
        len: u32,
    },
}

impl ReplyHeader {
    pub fn cookie(&self) -> u64 {
        match *self {
            ReplyHeader::Simple { cookie, .. } | ReplyHeader::Chunk { cookie, .. } => cookie,
        }
    }
}

/// Read a reply header. Structured chunks are refused unless negotiated.
pub fn read_reply_header(r: &mut dyn Read, structured: bool) -> io::Result<ReplyHeader> {
    let mut m = [0u8; 4];
    read_full(r, &mut m)?;
    match be32(&m) {
        SIMPLE_REPLY_MAGIC => {
            let mut b = [0u8; 12];
            read_full(r, &mut b)?;
            Ok(ReplyHeader::Simple {
                error: be32(&b),
                cookie: be64(&b[4..]),
            })
        }
        STRUCTURED_REPLY_MAGIC if structured => {
            let mut b = [0u8; 16];
            read_full(r, &mut b)?;
            Ok(ReplyHeader::Chunk {
                flags: be16(&b),
                kind: be16(&b[2..]),
                cookie: be64(&b[4..]),
                len: be32(&b[12..]),
            })
        }
        STRUCTURED_REPLY_MAGIC => Err(malformed("structured reply that was not negotiated")),
        m => Err(malformed(format!("bad reply magic {m:#010x}"))),
    }
}

/// A structured chunk, its payload parsed (OFFSET_DATA is handled by the
/// caller, which reads the data straight into its buffer).
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    None,
    Hole {
        offset: u64,
        len: u32,
    },
    BlockStatus {
        context: u32,
        extents: Vec<(u32, u32)>,
    },
    Error {
        code: u32,
        message: String,
        offset: Option<u64>,
    },
}

/// Read and parse the payload of a chunk of `kind` and `len` bytes (not
/// OFFSET_DATA). Unknown types without the error bit are malformed.
pub fn read_chunk(r: &mut dyn Read, kind: u16, len: u32) -> io::Result<Chunk> {
    let bound = match kind {
        REPLY_TYPE_NONE => 0,
        REPLY_TYPE_OFFSET_HOLE => 12,
        REPLY_TYPE_BLOCK_STATUS => MAX_BLOCK_STATUS,
        k if k & (1 << 15) != 0 => (MAX_MESSAGE + 14) as u32,
        REPLY_TYPE_OFFSET_DATA => return Err(malformed("data chunk where none is expected")),
        k => return Err(malformed(format!("unknown chunk type {k}"))),
    };
    if len > bound {
        return Err(malformed(format!("chunk type {kind} of {len} bytes")));
    }
    let mut d = blkhash::try_zeroed(len as usize, "a reply chunk")?;
    read_full(r, &mut d)?;
    parse_chunk(kind, &d)
}

/// Parse a chunk payload (not OFFSET_DATA).
pub fn parse_chunk(kind: u16, d: &[u8]) -> io::Result<Chunk> {
    match kind {
        REPLY_TYPE_NONE if d.is_empty() => Ok(Chunk::None),
        REPLY_TYPE_NONE => Err(malformed("NONE chunk with a payload")),
        REPLY_TYPE_OFFSET_HOLE if d.len() == 12 => {
            let len = be32(&d[8..]);
            if len == 0 {
                return Err(malformed("empty hole"));
            }
            Ok(Chunk::Hole {
                offset: be64(d),
                len,
            })
        }
        REPLY_TYPE_OFFSET_HOLE => Err(malformed("hole chunk of a wrong length")),
        REPLY_TYPE_BLOCK_STATUS => {
            if d.len() < 12 || !(d.len() - 4).is_multiple_of(8) {
                return Err(malformed("block status chunk of a wrong length"));
            }
            let mut extents = Vec::with_capacity((d.len() - 4) / 8);
            for e in d[4..].chunks_exact(8) {
                let len = be32(e);
                if len == 0 {
                    return Err(malformed("empty block status extent"));
                }
                extents.push((len, be32(&e[4..])));
            }
            Ok(Chunk::BlockStatus {
                context: be32(d),
                extents,
            })
        }
        k if k & (1 << 15) != 0 => {
            if d.len() < 6 {
                return Err(malformed("short error chunk"));
            }
            let code = be32(d);
            let mlen = be16(&d[4..]) as usize;
            let extra = if k == REPLY_TYPE_ERROR_OFFSET { 8 } else { 0 };
            if code == 0 || mlen > MAX_MESSAGE || 6 + mlen + extra > d.len() {
                return Err(malformed("bad error chunk"));
            }
            if (k == REPLY_TYPE_ERROR || k == REPLY_TYPE_ERROR_OFFSET)
                && 6 + mlen + extra != d.len()
            {
                return Err(malformed("error chunk of a wrong length"));
            }
            let message = String::from_utf8_lossy(&d[6..6 + mlen]).into_owned();
            let offset = (k == REPLY_TYPE_ERROR_OFFSET).then(|| be64(&d[6 + mlen..]));
            Ok(Chunk::Error {
                code,
                message,
                offset,
            })
        }
        k => Err(malformed(format!("unexpected chunk type {k}"))),
    }
}

/// A readable name for an NBD error code.
pub fn error_name(code: u32) -> String {
    match code {
        1 => "operation not permitted (EPERM)".into(),
        5 => "input/output error (EIO)".into(),
        12 => "cannot allocate memory (ENOMEM)".into(),
        22 => "invalid argument (EINVAL)".into(),
        28 => "no space left on device (ENOSPC)".into(),
        75 => "value too large (EOVERFLOW)".into(),
        95 => "operation not supported (ENOTSUP)".into(),
        108 => "server shutting down (ESHUTDOWN)".into(),
        c => format!("error {c}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        let mut b = Vec::new();
        b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b.extend_from_slice(&5u32.to_be_bytes());
        b.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(
            read_reply_header(&mut &b[..], false).unwrap(),
            ReplyHeader::Simple {
                error: 5,
                cookie: 7
            }
        );
        let mut c = Vec::new();
        c.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        c.extend_from_slice(&[0, 1, 0, 2]);
        c.extend_from_slice(&9u64.to_be_bytes());
        c.extend_from_slice(&12u32.to_be_bytes());
        assert!(read_reply_header(&mut &c[..], false).is_err());
        assert_eq!(
            read_reply_header(&mut &c[..], true).unwrap(),
            ReplyHeader::Chunk {
                flags: 1,
                kind: 2,
                cookie: 9,
                len: 12
            }
        );
        assert!(read_reply_header(&mut &b[..5], false).is_err());
        assert!(read_reply_header(&mut &[1u8, 2, 3, 4][..], true).is_err());
    }

    #[test]
    fn chunks() {
        let mut hole = 4096u64.to_be_bytes().to_vec();
        hole.extend_from_slice(&512u32.to_be_bytes());
        assert_eq!(
            parse_chunk(REPLY_TYPE_OFFSET_HOLE, &hole).unwrap(),
            Chunk::Hole {
                offset: 4096,
                len: 512
            }
        );
        assert!(parse_chunk(REPLY_TYPE_OFFSET_HOLE, &hole[..11]).is_err());
        let mut bs = 1u32.to_be_bytes().to_vec();
        bs.extend_from_slice(&[0, 0, 2, 0, 0, 0, 0, 3]);
        assert_eq!(
            parse_chunk(REPLY_TYPE_BLOCK_STATUS, &bs).unwrap(),
            Chunk::BlockStatus {
                context: 1,
                extents: vec![(512, 3)]
            }
        );
        assert!(parse_chunk(REPLY_TYPE_BLOCK_STATUS, &bs[..8]).is_err());
        let mut err = 5u32.to_be_bytes().to_vec();
        err.extend_from_slice(&2u16.to_be_bytes());
        err.extend_from_slice(b"no");
        assert_eq!(
            parse_chunk(REPLY_TYPE_ERROR, &err).unwrap(),
            Chunk::Error {
                code: 5,
                message: "no".into(),
                offset: None
            }
        );
        assert!(parse_chunk(REPLY_TYPE_ERROR_OFFSET, &err).is_err());
        assert!(parse_chunk(99, &[]).is_err());
        // Oversized payloads are refused before allocation.
        assert!(read_chunk(&mut &[][..], REPLY_TYPE_ERROR, u32::MAX).is_err());
        assert!(read_chunk(&mut &[][..], REPLY_TYPE_BLOCK_STATUS, u32::MAX).is_err());
    }

    #[test]
    fn infos() {
        let mut e = INFO_EXPORT.to_be_bytes().to_vec();
        e.extend_from_slice(&1024u64.to_be_bytes());
        e.extend_from_slice(&3u16.to_be_bytes());
        assert_eq!(
            parse_info(&e).unwrap(),
            Info::Export {
                size: 1024,
                flags: 3
            }
        );
        let mut b = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [512u32, 4096, 1 << 20] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert!(parse_info(&b).is_ok());
        b[2..6].copy_from_slice(&3u32.to_be_bytes());
        assert!(parse_info(&b).is_err());
    }
}
