//! The fixed newstyle handshake: greeting, (STARTTLS,) structured replies,
//! the base:allocation metadata context, and NBD_OPT_GO with the block size
//! constraints requested and honoured. Old servers work too: oldstyle,
//! plain newstyle (NBD_OPT_EXPORT_NAME), no structured replies.

use super::protocol::*;
use std::io::{self, Read, Write};

/// What the server greeted us with.
#[derive(Clone, Copy, Debug)]
pub enum Greeting {
    /// Newstyle: the handshake flags; options follow.
    Newstyle { fixed: bool, no_zeroes: bool },
    /// Oldstyle: the export is already chosen.
    Oldstyle { size: u64, flags: u16 },
}

/// The export as negotiated.
#[derive(Clone, Debug)]
pub struct Export {
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    /// The base:allocation context id, if block status can be used.
    pub allocation: Option<u32>,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// Read the server's greeting and answer it with our client flags.
pub fn greet<S: Read + Write>(s: &mut S) -> io::Result<Greeting> {
    let mut b = [0u8; 16];
    read_full(s, &mut b)?;
    if be64(&b) != NBDMAGIC {
        return Err(malformed("not an NBD server (bad magic)"));
    }
    match be64(&b[8..]) {
        IHAVEOPT => {
            let mut f = [0u8; 2];
            read_full(s, &mut f)?;
            let flags = u16::from_be_bytes(f);
            let fixed = flags & FLAG_FIXED_NEWSTYLE != 0;
            let no_zeroes = flags & FLAG_NO_ZEROES != 0;
            let mut c = 0;
            if fixed {
                c |= FLAG_C_FIXED_NEWSTYLE;
            }
            if no_zeroes {
                c |= FLAG_C_NO_ZEROES;
            }
            s.write_all(&c.to_be_bytes())?;
            Ok(Greeting::Newstyle { fixed, no_zeroes })
        }
        CLISERV_MAGIC => {
            let mut r = [0u8; 8 + 4 + 124];
            read_full(s, &mut r)?;
            let flags = u32::from_be_bytes(r[8..12].try_into().unwrap());
            Ok(Greeting::Oldstyle {
                size: be64(&r),
                flags: flags as u16,
            })
        }
        _ => Err(malformed("not an NBD server (bad handshake magic)")),
    }
}

/// Ask for TLS (fixed newstyle only): Ok(()) once the server said yes.
pub fn starttls<S: Read + Write>(s: &mut S) -> io::Result<()> {
    s.write_all(&option(OPT_STARTTLS, &[]))?;
    s.flush()?;
    let r = read_option_reply(s, OPT_STARTTLS)?;
    if r.kind == REP_ACK {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "the server refused TLS: {}",
        if r.is_error() {
            r.error_text()
        } else {
            "unexpected reply".into()
        }
    )))
}

/// The server refused an option because the client did not start TLS.
#[derive(Debug)]
struct TlsRequired;

impl std::fmt::Display for TlsRequired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("server requires TLS")
    }
}

impl std::error::Error for TlsRequired {}

/// True if `e` says the server wants TLS (the URL should be nbds://).
pub fn is_tls_required(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<TlsRequired>())
}

/// An option reply, where NBD_REP_ERR_TLS_REQD is an error of its own.
fn reply<S: Read>(s: &mut S, opt: u32) -> io::Result<OptionReply> {
    let r = read_option_reply(s, opt)?;
    if r.kind == REP_ERR_TLS_REQD {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, TlsRequired));
    }
    Ok(r)
}

fn oldstyle_export(size: u64, flags: u16) -> Export {
    Export {
        size,
        flags,
        structured: false,
        allocation: None,
        min_block: 1,
        preferred_block: 4096,
        max_payload: DEFAULT_MAX_PAYLOAD,
    }
}

/// Negotiate the options and enter transmission on `export`.
pub fn negotiate<S: Read + Write>(
    s: &mut S,
    greeting: Greeting,
    export: &str,
) -> io::Result<Export> {
    let (fixed, no_zeroes) = match greeting {
        Greeting::Oldstyle { size, flags } => return Ok(oldstyle_export(size, flags)),
        Greeting::Newstyle { fixed, no_zeroes } => (fixed, no_zeroes),
    };
    if !fixed {
        return export_name(s, export, no_zeroes);
    }
    // Structured replies, then base:allocation.
    s.write_all(&option(OPT_STRUCTURED_REPLY, &[]))?;
    let r = reply(s, OPT_STRUCTURED_REPLY)?;
    let structured = r.kind == REP_ACK;
    if !structured && !r.is_error() {
        return Err(malformed("unexpected reply to NBD_OPT_STRUCTURED_REPLY"));
    }
    let mut allocation = None;
    if structured {
        s.write_all(&option(
            OPT_SET_META_CONTEXT,
            &meta_context_data(export, &[BASE_ALLOCATION]),
        ))?;
        loop {
            let r = reply(s, OPT_SET_META_CONTEXT)?;
            match r.kind {
                REP_META_CONTEXT => {
                    let (id, name) = parse_meta_context(&r.data)?;
                    if name == BASE_ALLOCATION {
                        allocation = Some(id);
                    }
                }
                REP_ACK => break,
                _ if r.is_error() => {
                    allocation = None;
                    break;
                }
                k => return Err(malformed(format!("reply {k} to NBD_OPT_SET_META_CONTEXT"))),
            }
        }
    }
    // GO, asking for the block size constraints (which we then honour).
    s.write_all(&option(OPT_GO, &go_data(export, &[INFO_BLOCK_SIZE])))?;
    let mut size_flags = None;
    let mut sizes = None;
    loop {
        let r = reply(s, OPT_GO)?;
        match r.kind {
            REP_INFO => match parse_info(&r.data)? {
                Info::Export { size, flags } => size_flags = Some((size, flags)),
                Info::BlockSize {
                    min,
                    preferred,
                    max,
                } => sizes = Some((min, preferred, max)),
                Info::Other => {}
            },
            REP_ACK => break,
            REP_ERR_UNSUP => return export_name(s, export, no_zeroes),
            _ if r.is_error() => {
                return Err(io::Error::other(format!(
                    "the server refused export '{export}': {}",
                    r.error_text()
                )));
            }
            k => return Err(malformed(format!("reply {k} to NBD_OPT_GO"))),
        }
    }
    let (size, flags) =
        size_flags.ok_or_else(|| malformed("NBD_OPT_GO without the export size"))?;
    let (min_block, preferred_block, max_payload) = sizes.unwrap_or((1, 4096, DEFAULT_MAX_PAYLOAD));
    Ok(Export {
        size,
        flags,
        structured,
        allocation,
        min_block,
        preferred_block,
        max_payload,
    })
}

/// The old way to choose an export: no error reply, the size right away.
fn export_name<S: Read + Write>(s: &mut S, export: &str, no_zeroes: bool) -> io::Result<Export> {
    s.write_all(&option(OPT_EXPORT_NAME, export.as_bytes()))?;
    let mut b = [0u8; 10 + 124];
    let n = if no_zeroes { 10 } else { b.len() };
    read_full(s, &mut b[..n]).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("export '{export}': {e} (unknown export?)"),
        )
    })?;
    Ok(oldstyle_export(be64(&b), u16::from_be_bytes([b[8], b[9]])))
}
