//! The fixed newstyle handshake: greeting, (STARTTLS,) structured replies,
//! the base:allocation metadata context (and a QEMU dirty bitmap's, when
//! asked for), and NBD_OPT_GO with the block size constraints requested and
//! honoured. Old servers work too: oldstyle, plain newstyle
//! (NBD_OPT_EXPORT_NAME), no structured replies; but not with a dirty
//! bitmap, which needs metadata contexts.
//!
//! Nothing the server sends is trusted to end: every stage (the greeting,
//! each option) has a deadline for all its replies together, not per
//! read(), so a server sending one byte a second times out as a silent one
//! does; and the replies to one option are bounded in number and bytes, so
//! endless NBD_REP_INFO or NBD_REP_META_CONTEXT replies are an error, with
//! or without a timeout.

use super::protocol::*;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

/// Replies to one option at most. We ask for two metadata contexts at
/// most and one info (the server adds the export info): a few replies are
/// expected, a few dozen means the server will not stop.
pub const MAX_OPTION_REPLIES: usize = 32;
/// Bytes of replies to one option at most (each is also at most
/// [`MAX_OPTION_REPLY`]).
pub const MAX_OPTION_BYTES: usize = 256 << 10;
/// Replies to NBD_OPT_LIST_META_CONTEXT at most: one per dirty bitmap the
/// server exports, so more than an option's usual few (the bytes are
/// still bounded by [`MAX_OPTION_BYTES`]).
pub const MAX_LIST_REPLIES: usize = 1024;
/// The smallest maximum payload accepted from a server. Portable clients
/// send requests aligned to 512 bytes (the NBD spec's advice to clients
/// when the server gives no constraints), so a server that cannot take a
/// 512-byte request cannot serve them; below that, each MiB would cost
/// more than 2048 requests (one a byte, at 1).
pub const MIN_MAX_PAYLOAD: u32 = 512;

/// A stream whose reads are bounded by a deadline per handshake stage.
pub trait SetReadTimeout {
    /// Set the read timeout of the underlying socket (`None`: none).
    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()>;
}

/// The handshake's view of the connection: reads fail once the current
/// stage's deadline has passed, with an error naming the stage. The
/// socket's read timeout is put back to `timeout` when this is dropped,
/// for the transmission phase.
pub struct Timed<'a, S: Read + Write + SetReadTimeout> {
    s: &'a mut S,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    stage: String,
}

impl<'a, S: Read + Write + SetReadTimeout> Timed<'a, S> {
    pub fn new(s: &'a mut S, timeout: Option<Duration>) -> Self {
        let mut t = Timed {
            s,
            timeout,
            deadline: None,
            stage: String::new(),
        };
        t.stage("the server's greeting");
        t
    }

    /// Start a stage: what we wait for, and a fresh deadline.
    pub fn stage(&mut self, what: impl Into<String>) {
        self.stage = what.into();
        self.deadline = self.timeout.map(|t| Instant::now() + t);
    }

    /// The error for a stage that did not end in time.
    fn timed_out(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "timed out after {} s waiting for {}",
                self.timeout.unwrap_or_default().as_secs_f64(),
                self.stage
            ),
        )
    }
}

impl<S: Read + Write + SetReadTimeout> Drop for Timed<'_, S> {
    fn drop(&mut self) {
        let _ = self.s.set_read_timeout(self.timeout);
    }
}

impl<S: Read + Write + SetReadTimeout> Read for Timed<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timed_out());
            }
            self.s.set_read_timeout(Some(left))?;
        }
        self.s.read(buf).map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                self.timed_out()
            } else {
                e
            }
        })
    }
}

impl<S: Read + Write + SetReadTimeout> Write for Timed<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

/// The replies to one option, counted: an error once there are too many.
struct Replies {
    opt: &'static str,
    count: usize,
    bytes: usize,
    max: usize,
}

impl Replies {
    fn new(opt: &'static str) -> Replies {
        Replies::with_limit(opt, MAX_OPTION_REPLIES)
    }

    /// At most `max` replies (and [`MAX_OPTION_BYTES`]).
    fn with_limit(opt: &'static str, max: usize) -> Replies {
        Replies {
            opt,
            count: 0,
            bytes: 0,
            max,
        }
    }

    fn next<S: Read>(&mut self, s: &mut S, opt: u32) -> io::Result<OptionReply> {
        if self.count >= self.max || self.bytes > MAX_OPTION_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the server sent more than {} replies ({} bytes) to {} without ending them",
                    self.count, self.bytes, self.opt
                ),
            ));
        }
        let r = reply(s, opt)?;
        self.count += 1;
        self.bytes += 20 + r.data.len();
        Ok(r)
    }
}

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
    /// The `qemu:dirty-bitmap:NAME` context id, when the bitmap was asked
    /// for ([`Wanted::bitmap`]); never the same as `allocation`.
    pub bitmap: Option<u32>,
    /// The server's dirty bitmaps by name (without the context prefix, in
    /// the server's order), when [`Wanted::list_bitmaps`] asked; empty if
    /// the server lists none or cannot list.
    pub listed: Vec<String>,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
}

/// What to negotiate beyond the export itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted<'a> {
    /// A QEMU dirty bitmap's metadata context (`qemu:dirty-bitmap:NAME`),
    /// next to base:allocation: an error if the server does not give it.
    pub bitmap: Option<&'a str>,
    /// List the server's dirty bitmaps (NBD_OPT_LIST_META_CONTEXT).
    pub list_bitmaps: bool,
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// Read the server's greeting and answer it with our client flags.
pub fn greet<S: Read + Write + SetReadTimeout>(s: &mut Timed<S>) -> io::Result<Greeting> {
    s.stage("the server's greeting");
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
pub fn starttls<S: Read + Write + SetReadTimeout>(s: &mut Timed<S>) -> io::Result<()> {
    s.stage("the server's reply to NBD_OPT_STARTTLS");
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
        bitmap: None,
        listed: Vec::new(),
        min_block: 1,
        preferred_block: 4096,
        max_payload: DEFAULT_MAX_PAYLOAD,
    }
}

/// Negotiate the options and enter transmission on `export`.
pub fn negotiate<S: Read + Write + SetReadTimeout>(
    s: &mut Timed<S>,
    greeting: Greeting,
    export: &str,
    want: Wanted,
) -> io::Result<Export> {
    let no_zeroes = match greeting {
        Greeting::Newstyle {
            fixed: true,
            no_zeroes,
        } => no_zeroes,
        _ => return without_options(s, greeting, export, want.bitmap),
    };
    // Structured replies, then base:allocation (and the bitmap).
    let structured = structured_replies(s)?;
    // Listed after structured replies, which some servers (nbdkit) want
    // first; a refusal only leaves the list empty.
    let listed = if want.list_bitmaps {
        list_meta_contexts(s, export, DIRTY_BITMAP_PREFIX)?.unwrap_or_default()
    } else {
        Vec::new()
    };
    let bitmap_context = want.bitmap.map(|n| format!("{DIRTY_BITMAP_PREFIX}{n}"));
    let (allocation, bitmap) = if structured {
        set_meta_contexts(s, export, bitmap_context.as_deref())?
    } else {
        (None, None)
    };
    if let (Some(name), None) = (want.bitmap, bitmap) {
        let why = if structured {
            offered(s, export)?
        } else {
            "it does not do structured replies, which block status needs".into()
        };
        abort(s);
        return Err(no_bitmap(name, why));
    }
    let Some((size, flags, sizes)) = go(s, export)? else {
        // NBD_OPT_EXPORT_NAME ends the handshake without the metadata
        // contexts a bitmap needs.
        if let Some(name) = want.bitmap {
            abort(s);
            return Err(no_bitmap(name, "it has no NBD_OPT_GO".into()));
        }
        let mut e = export_name(s, export, no_zeroes)?;
        e.listed = listed;
        return Ok(e);
    };
    let (min_block, preferred_block, max_payload) = match sizes {
        Some((min, preferred, max)) => check_block_sizes(min, preferred, max)?,
        None => (1, 4096, DEFAULT_MAX_PAYLOAD),
    };
    Ok(Export {
        size,
        flags,
        structured,
        allocation,
        bitmap,
        listed,
        min_block,
        preferred_block,
        max_payload,
    })
}

/// The export of a server that takes no options (oldstyle, or newstyle
/// without the fixed extension): none can ask for a dirty bitmap.
fn without_options<S: Read + Write + SetReadTimeout>(
    s: &mut Timed<S>,
    greeting: Greeting,
    export: &str,
    bitmap: Option<&str>,
) -> io::Result<Export> {
    let (why, newstyle) = match greeting {
        Greeting::Oldstyle { .. } => ("an oldstyle server, without options", None),
        Greeting::Newstyle { no_zeroes, .. } => (
            "a newstyle server without fixed newstyle options",
            Some(no_zeroes),
        ),
    };
    if let Some(name) = bitmap {
        return Err(no_bitmap(name, why.into()));
    }
    match (greeting, newstyle) {
        (Greeting::Oldstyle { size, flags }, _) => Ok(oldstyle_export(size, flags)),
        (_, no_zeroes) => export_name(s, export, no_zeroes.unwrap_or(false)),
    }
}

/// NBD_OPT_STRUCTURED_REPLY: whether the server agreed (a refusal is no
/// error; anything else is).
fn structured_replies<S: Read + Write + SetReadTimeout>(s: &mut Timed<S>) -> io::Result<bool> {
    s.stage("the server's reply to NBD_OPT_STRUCTURED_REPLY");
    s.write_all(&option(OPT_STRUCTURED_REPLY, &[]))?;
    let r = reply(s, OPT_STRUCTURED_REPLY)?;
    let structured = r.kind == REP_ACK;
    if !structured && !r.is_error() {
        return Err(malformed("unexpected reply to NBD_OPT_STRUCTURED_REPLY"));
    }
    Ok(structured)
}

/// The block size constraints a server sent: minimum, preferred, maximum payload.
type BlockSizes = (u32, u32, u32);

/// NBD_OPT_GO, asking for the block size constraints (which we then
/// honour): the export's size and flags and the constraints if the server
/// sent them, or `None` when the server has no NBD_OPT_GO (an old server:
/// NBD_OPT_EXPORT_NAME is left to try).
fn go<S: Read + Write + SetReadTimeout>(
    s: &mut Timed<S>,
    export: &str,
) -> io::Result<Option<(u64, u16, Option<BlockSizes>)>> {
    s.stage("the server's reply to NBD_OPT_GO");
    s.write_all(&option(OPT_GO, &go_data(export, &[INFO_BLOCK_SIZE])))?;
    let mut size_flags = None;
    let mut sizes = None;
    let mut replies = Replies::new("NBD_OPT_GO");
    loop {
        let r = replies.next(s, OPT_GO)?;
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
            REP_ERR_UNSUP => return Ok(None),
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
    Ok(Some((size, flags, sizes)))
}

/// NBD_OPT_SET_META_CONTEXT for base:allocation and `bitmap` (a context
/// name) if given: their ids, each if the server gave it. An error reply
/// means none (an old server without block status).
fn set_meta_contexts<S: Read + Write + SetReadTimeout>(
    s: &mut Timed<S>,
    export: &str,
    bitmap: Option<&str>,
) -> io::Result<(Option<u32>, Option<u32>)> {
    s.stage("the server's replies to NBD_OPT_SET_META_CONTEXT");
    let mut queries = vec![BASE_ALLOCATION];
    queries.extend(bitmap);
    s.write_all(&option(
        OPT_SET_META_CONTEXT,
        &meta_context_data(export, &queries),
    ))?;
    let mut replies = Replies::new("NBD_OPT_SET_META_CONTEXT");
    let (mut allocation, mut dirty) = (None, None);
    loop {
        let r = replies.next(s, OPT_SET_META_CONTEXT)?;
        match r.kind {
            REP_META_CONTEXT => {
                let (id, name) = parse_meta_context(&r.data)?;
                if name == BASE_ALLOCATION {
                    allocation = Some(id);
                } else if Some(name.as_str()) == bitmap {
                    dirty = Some(id);
                }
            }
            REP_ACK => break,
            _ if r.is_error() => return Ok((None, None)),
            k => return Err(malformed(format!("reply {k} to NBD_OPT_SET_META_CONTEXT"))),
        }
    }
    // Block status chunks are told apart by id alone.
    if allocation.is_some() && allocation == dirty {
        return Err(malformed(
            "the same metadata context id for base:allocation and the dirty bitmap",
        ));
    }
    Ok((allocation, dirty))
}

/// NBD_OPT_LIST_META_CONTEXT for `query` on `export`: the names after the
/// query's prefix (non-empty, each once, in the server's order); `None` if
/// the server refused the option (its error's text is dropped: listing is
/// only ever informative).
fn list_meta_contexts<S: Read + Write + SetReadTimeout>(
    s: &mut Timed<S>,
    export: &str,
    query: &str,
) -> io::Result<Option<Vec<String>>> {
    s.stage("the server's replies to NBD_OPT_LIST_META_CONTEXT");
    s.write_all(&option(
        OPT_LIST_META_CONTEXT,
        &meta_context_data(export, &[query]),
    ))?;
    let mut replies = Replies::with_limit("NBD_OPT_LIST_META_CONTEXT", MAX_LIST_REPLIES);
    let mut names: Vec<String> = Vec::new();
    loop {
        let r = replies.next(s, OPT_LIST_META_CONTEXT)?;
        match r.kind {
            REP_META_CONTEXT => {
                let (_, name) = parse_meta_context(&r.data)?;
                if let Some(n) = name.strip_prefix(query)
                    && !n.is_empty()
                    && !names.iter().any(|x| x == n)
                {
                    names.push(n.to_string());
                }
            }
            REP_ACK => return Ok(Some(names)),
            _ if r.is_error() => return Ok(None),
            k => return Err(malformed(format!("reply {k} to NBD_OPT_LIST_META_CONTEXT"))),
        }
    }
}

/// What the server offers instead of a missing bitmap, for the error.
fn offered<S: Read + Write + SetReadTimeout>(s: &mut Timed<S>, export: &str) -> io::Result<String> {
    Ok(match list_meta_contexts(s, export, DIRTY_BITMAP_PREFIX)? {
        None => "it does not list its metadata contexts".into(),
        Some(v) if v.is_empty() => "it offers no dirty bitmap".into(),
        Some(v) => {
            let v: Vec<String> = v
                .iter()
                .map(|n| format!("{DIRTY_BITMAP_PREFIX}{n}"))
                .collect();
            format!("it offers: {}", v.join(", "))
        }
    })
}

/// The error for a dirty bitmap the server does not give, and why.
fn no_bitmap(name: &str, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "the server does not offer the metadata context {DIRTY_BITMAP_PREFIX}{name} ({why})"
        ),
    )
}

/// Leave the handshake politely (NBD_OPT_ABORT, a soft disconnect) before
/// dropping the connection; the server's answer does not matter.
fn abort<S: Read + Write + SetReadTimeout>(s: &mut Timed<S>) {
    let _ = s.write_all(&option(OPT_ABORT, &[])).and_then(|_| s.flush());
}

/// Refuse block size constraints we cannot honour sensibly. The minimum
/// and preferred sizes were checked by [`parse_info`] (powers of two, the
/// minimum at most 64 KiB, as the spec says); the preferred size is a hint
/// we do not need. A maximum payload below [`MIN_MAX_PAYLOAD`] is refused;
/// any larger one is fine, since our requests are at most 1 MiB anyway.
fn check_block_sizes(min: u32, preferred: u32, max: u32) -> io::Result<(u32, u32, u32)> {
    if max < MIN_MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the server's block size constraints (minimum {min}, preferred {preferred}, \
                 maximum {max}) are unusable: a maximum payload below {MIN_MAX_PAYLOAD} bytes"
            ),
        ));
    }
    Ok((min, preferred, max))
}

/// The old way to choose an export: no error reply, the size right away.
fn export_name<S: Read + Write + SetReadTimeout>(
    s: &mut Timed<S>,
    export: &str,
    no_zeroes: bool,
) -> io::Result<Export> {
    s.stage("the server's reply to NBD_OPT_EXPORT_NAME");
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

/// A server as bytes: reads come from them, writes are dropped.
struct Scripted<'a>(&'a [u8]);

impl Read for Scripted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Scripted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl SetReadTimeout for Scripted<'_> {
    fn set_read_timeout(&mut self, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

/// The whole handshake against `server`'s bytes.
fn scripted(server: &[u8], starttls: bool, want: Wanted) -> io::Result<Export> {
    let mut s = Scripted(server);
    let mut t = Timed::new(&mut s, None);
    let g = greet(&mut t)?;
    if starttls {
        // As if the session were encrypted from here: the same bytes.
        self::starttls(&mut t)?;
    }
    negotiate(&mut t, g, "disk", want)
}

/// For the `nbd_handshake` fuzz target: a hostile server's bytes from the
/// greeting through NBD_OPT_GO (bit 0 of `flags`: NBD_OPT_STARTTLS first;
/// bit 1: the dirty bitmap "b" is asked for; bit 2: bitmaps are listed).
/// Errors are fine; a panic, a hang or an unbounded allocation is a bug,
/// and an accepted export must have block sizes we can honour, and the
/// bitmap asked for, under an id of its own.
#[doc(hidden)]
pub fn fuzz_handshake(server: &[u8], flags: u8) {
    let want = Wanted {
        bitmap: (flags & 2 != 0).then_some("b"),
        list_bitmaps: flags & 4 != 0,
    };
    if let Ok(e) = scripted(server, flags & 1 != 0, want) {
        assert!(e.min_block.is_power_of_two() && e.min_block <= 65536);
        assert!(e.max_payload >= e.min_block);
        assert!(e.max_payload >= MIN_MAX_PAYLOAD);
        if want.bitmap.is_some() {
            assert!(e.structured && e.bitmap.is_some() && e.bitmap != e.allocation);
        } else {
            assert!(e.bitmap.is_none());
        }
        assert!(e.listed.len() <= MAX_LIST_REPLIES);
        assert!(want.list_bitmaps || e.listed.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut v = NBDMAGIC.to_be_bytes().to_vec();
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        v
    }

    fn rep(opt: u32, kind: u32, data: &[u8]) -> Vec<u8> {
        let mut v = OPT_REPLY_MAGIC.to_be_bytes().to_vec();
        for x in [opt, kind, data.len() as u32] {
            v.extend_from_slice(&x.to_be_bytes());
        }
        v.extend_from_slice(data);
        v
    }

    fn info_export() -> Vec<u8> {
        let mut d = INFO_EXPORT.to_be_bytes().to_vec();
        d.extend_from_slice(&(1u64 << 20).to_be_bytes());
        d.extend_from_slice(&1u16.to_be_bytes());
        rep(OPT_GO, REP_INFO, &d)
    }

    fn info_sizes(min: u32, preferred: u32, max: u32) -> Vec<u8> {
        let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for x in [min, preferred, max] {
            d.extend_from_slice(&x.to_be_bytes());
        }
        rep(OPT_GO, REP_INFO, &d)
    }

    /// A server up to NBD_OPT_GO's replies (structured, base:allocation).
    fn before_go() -> Vec<u8> {
        let mut v = greeting();
        v.extend(rep(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
        let mut ctx = 7u32.to_be_bytes().to_vec();
        ctx.extend_from_slice(BASE_ALLOCATION.as_bytes());
        v.extend(rep(OPT_SET_META_CONTEXT, REP_META_CONTEXT, &ctx));
        v.extend(rep(OPT_SET_META_CONTEXT, REP_ACK, &[]));
        v
    }

    #[test]
    fn a_valid_handshake() {
        let mut v = before_go();
        v.extend(info_export());
        v.extend(info_sizes(512, 4096, 1 << 20));
        v.extend(rep(OPT_GO, REP_ACK, &[]));
        let e = scripted(&v, false, Wanted::default()).unwrap();
        assert_eq!(
            (e.size, e.allocation, e.min_block, e.max_payload),
            (1 << 20, Some(7), 512, 1 << 20)
        );
    }

    #[test]
    fn unusable_block_sizes_are_refused() {
        for (max, ok) in [(1, false), (256, false), (512, true), (u32::MAX, true)] {
            let mut v = before_go();
            v.extend(info_export());
            v.extend(info_sizes(1, 1, max));
            v.extend(rep(OPT_GO, REP_ACK, &[]));
            let r = scripted(&v, false, Wanted::default());
            assert_eq!(r.is_ok(), ok, "max {max}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("block size"), "{e}");
            }
        }
    }

    #[test]
    fn endless_replies_are_bounded() {
        // Far more replies than allowed, and no end: an error, not a loop.
        let mut go = before_go();
        for _ in 0..10 * MAX_OPTION_REPLIES {
            go.extend(info_export());
        }
        let e = scripted(&go, false, Wanted::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("NBD_OPT_GO") && e.contains("replies"), "{e}");
        let mut meta = greeting();
        meta.extend(rep(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
        let mut ctx = 7u32.to_be_bytes().to_vec();
        ctx.extend_from_slice(BASE_ALLOCATION.as_bytes());
        for _ in 0..10 * MAX_OPTION_REPLIES {
            meta.extend(rep(OPT_SET_META_CONTEXT, REP_META_CONTEXT, &ctx));
        }
        let e = scripted(&meta, false, Wanted::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("NBD_OPT_SET_META_CONTEXT"), "{e}");
    }

    fn context(opt: u32, id: u32, name: &str) -> Vec<u8> {
        let mut d = id.to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        rep(opt, REP_META_CONTEXT, &d)
    }

    fn go() -> Vec<u8> {
        let mut v = info_export();
        v.extend(rep(OPT_GO, REP_ACK, &[]));
        v
    }

    const BITMAP_B: Wanted = Wanted {
        bitmap: Some("b"),
        list_bitmaps: false,
    };

    #[test]
    fn a_dirty_bitmap_is_negotiated() {
        let mut v = greeting();
        v.extend(rep(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
        v.extend(context(OPT_SET_META_CONTEXT, 8, "qemu:dirty-bitmap:b"));
        v.extend(context(OPT_SET_META_CONTEXT, 7, BASE_ALLOCATION));
        v.extend(rep(OPT_SET_META_CONTEXT, REP_ACK, &[]));
        v.extend(go());
        let e = scripted(&v, false, BITMAP_B).unwrap();
        assert_eq!((e.allocation, e.bitmap), (Some(7), Some(8)));
        // Not asked for, the same context is not kept.
        let e = scripted(&v, false, Wanted::default()).unwrap();
        assert_eq!((e.allocation, e.bitmap), (Some(7), None));
    }

    #[test]
    fn a_missing_bitmap_names_what_is_offered() {
        let mut v = before_go();
        v.extend(context(OPT_LIST_META_CONTEXT, 0, "qemu:dirty-bitmap:other"));
        v.extend(context(OPT_LIST_META_CONTEXT, 0, "qemu:dirty-bitmap:more"));
        v.extend(rep(OPT_LIST_META_CONTEXT, REP_ACK, &[]));
        let e = scripted(&v, false, BITMAP_B).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            e.to_string(),
            "the server does not offer the metadata context qemu:dirty-bitmap:b \
             (it offers: qemu:dirty-bitmap:other, qemu:dirty-bitmap:more)"
        );
        // A server that lists nothing, or cannot list.
        let mut v = before_go();
        v.extend(rep(OPT_LIST_META_CONTEXT, REP_ACK, &[]));
        let e = scripted(&v, false, BITMAP_B).unwrap_err().to_string();
        assert!(
            e.contains("qemu:dirty-bitmap:b (it offers no dirty bitmap)"),
            "{e}"
        );
        let mut v = before_go();
        v.extend(rep(OPT_LIST_META_CONTEXT, REP_ERR_UNSUP, &[]));
        let e = scripted(&v, false, BITMAP_B).unwrap_err().to_string();
        assert!(e.contains("qemu:dirty-bitmap:b"), "{e}");
        // Old servers: no structured replies, no options at all.
        let mut v = greeting();
        v.extend(rep(OPT_STRUCTURED_REPLY, REP_ERR_UNSUP, &[]));
        let e = scripted(&v, false, BITMAP_B).unwrap_err().to_string();
        assert!(
            e.contains("qemu:dirty-bitmap:b") && e.contains("structured"),
            "{e}"
        );
        let mut v = NBDMAGIC.to_be_bytes().to_vec();
        v.extend_from_slice(&CLISERV_MAGIC.to_be_bytes());
        v.extend_from_slice(&(1u64 << 20).to_be_bytes());
        v.extend_from_slice(&[0u8; 4 + 124]);
        let e = scripted(&v, false, BITMAP_B).unwrap_err().to_string();
        assert!(
            e.contains("qemu:dirty-bitmap:b") && e.contains("oldstyle"),
            "{e}"
        );
        assert!(scripted(&v, false, Wanted::default()).is_ok());
    }

    #[test]
    fn one_id_for_two_contexts_is_refused() {
        let mut v = greeting();
        v.extend(rep(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
        v.extend(context(OPT_SET_META_CONTEXT, 7, BASE_ALLOCATION));
        v.extend(context(OPT_SET_META_CONTEXT, 7, "qemu:dirty-bitmap:b"));
        v.extend(rep(OPT_SET_META_CONTEXT, REP_ACK, &[]));
        v.extend(go());
        let e = scripted(&v, false, BITMAP_B).unwrap_err().to_string();
        assert!(e.contains("same metadata context id"), "{e}");
    }

    #[test]
    fn bitmaps_are_listed() {
        let mut v = greeting();
        v.extend(rep(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
        for name in [
            "qemu:dirty-bitmap:a",
            "qemu:dirty-bitmap:b",
            "qemu:dirty-bitmap:a",
        ] {
            v.extend(context(OPT_LIST_META_CONTEXT, 0, name));
        }
        // Not a bitmap, and an empty name: not listed.
        v.extend(context(OPT_LIST_META_CONTEXT, 0, "qemu:allocation-depth"));
        v.extend(context(OPT_LIST_META_CONTEXT, 0, "qemu:dirty-bitmap:"));
        v.extend(rep(OPT_LIST_META_CONTEXT, REP_ACK, &[]));
        v.extend(context(OPT_SET_META_CONTEXT, 7, BASE_ALLOCATION));
        v.extend(rep(OPT_SET_META_CONTEXT, REP_ACK, &[]));
        v.extend(go());
        let want = Wanted {
            bitmap: None,
            list_bitmaps: true,
        };
        let e = scripted(&v, false, want).unwrap();
        assert_eq!(e.listed, ["a", "b"]);
        // Endless listing is bounded like any option's replies.
        let mut v = greeting();
        v.extend(rep(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
        for i in 0..2 * MAX_LIST_REPLIES {
            v.extend(context(
                OPT_LIST_META_CONTEXT,
                0,
                &format!("qemu:dirty-bitmap:{i}"),
            ));
        }
        let e = scripted(&v, false, want).unwrap_err().to_string();
        assert!(e.contains("NBD_OPT_LIST_META_CONTEXT"), "{e}");
    }
}
