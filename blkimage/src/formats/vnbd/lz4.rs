//! lz4 frames of compressed streams: decoded whole (python-lz4 links a
//! frame's blocks, so a part cannot be had alone) straight into the buffer
//! the digest workers then hash in place ([`super::lz4frame`]), by the
//! digest worker that first needs the frame, the last few kept.

use super::lz4frame;
use super::memory::grow;
use super::parse::{Lz4Frame, bad};
use crate::storage::Storage;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Decompressed frames kept: the one each digest thread of a small
/// machine reads, the one decompressed ahead, and one more. At most [`super::parse::MAX_LZ4_FRAME`] bytes each.
const KEPT: usize = 4;

type Bytes = Result<Arc<Frame>, (io::ErrorKind, String)>;
/// A frame: (stream, frame).
type Key = (u32, u32);
/// How to decompress a frame.
pub type Load<'a> = &'a dyn Fn() -> io::Result<Frame>;

/// Buffers of decompressed frames kept for the next frames: a fresh one
/// of up to 32 MiB each frame cost as much in page faults as the
/// decompression (a 512 MiB lz4 stream: a quarter of the run's time).
const POOLED: usize = 2;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A decompressed frame's bytes, whose buffer goes back to the pool when
/// the last reader lets go of it.
pub struct Frame(Vec<u8>);

impl std::ops::Deref for Frame {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOLED {
            pool.push(std::mem::take(&mut self.0));
        }
    }
}

/// A buffer of `len` bytes, from the pool if it holds one; else allocated,
/// or an error if the memory cannot be had. A recycled buffer of a full
/// frame is reused as it is (the decoder writes every byte).
fn buffer(len: usize) -> io::Result<Vec<u8>> {
    let pooled = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let mut buf = pooled.unwrap_or_default();
    grow(&mut buf, len, "an lz4 frame")?;
    Ok(buf)
}

/// A frame's bytes, once decompressed, and whether a thread started.
#[derive(Default)]
struct Entry {
    started: AtomicBool,
    bytes: OnceLock<Bytes>,
}

impl Entry {
    fn load(&self, load: impl FnOnce() -> io::Result<Frame>) -> io::Result<Arc<Frame>> {
        self.started.store(true, Ordering::Relaxed);
        self.bytes
            .get_or_init(|| load().map(Arc::new).map_err(|e| (e.kind(), e.to_string())))
            .clone()
            .map_err(|(kind, msg)| io::Error::new(kind, msg))
    }
}

/// The frames decompressed last, by (stream, frame). A frame asked for by
/// two threads at once is decompressed once: the second, rather than wait
/// idle, decompresses the frame after it first (the reads of one frame
/// come in order, from every digest thread), then waits.
#[derive(Default)]
pub struct Cache {
    slots: Mutex<VecDeque<(Key, Arc<Entry>)>>,
}

impl Cache {
    /// The entry of `key`, made the newest (added if it is not there).
    fn entry(&self, key: Key) -> Arc<Entry> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.iter().position(|(k, _)| *k == key) {
            Some(i) => slots.remove(i).expect("found"),
            None => (key, Arc::new(Entry::default())),
        };
        let entry = slot.1.clone();
        slots.push_back(slot);
        if slots.len() > KEPT {
            slots.pop_front();
        }
        entry
    }

    /// The bytes of frame `key`, decompressed by `load` unless they are
    /// kept; `next` the frame after it, if any, and how to load it.
    pub fn get(
        &self,
        key: Key,
        load: impl FnOnce() -> io::Result<Frame>,
        next: Option<(Key, Load)>,
    ) -> io::Result<Arc<Frame>> {
        let entry = self.entry(key);
        if entry.bytes.get().is_none()
            && entry.started.swap(true, Ordering::Relaxed)
            && let Some((nkey, nload)) = next
        {
            let ahead = self.entry(nkey);
            if !ahead.started.swap(true, Ordering::Relaxed) {
                // Its errors are the reader's of that frame to report.
                let _ = ahead.load(nload);
            }
            // The frame asked for is the newest again.
            self.entry(key);
        }
        entry.load(load)
    }
}

/// The guest bytes of lz4 frame `f`, checked against its checksums and
/// the length its header promised.
pub fn decompress(st: &dyn Storage, f: Lz4Frame) -> io::Result<Frame> {
    let len = f.comp as usize;
    if st.lendable(f.pos, len) == len {
        // Decompressed from the file's pages where they are.
        let mut out = None;
        st.read_in_place(f.pos, len, &mut |comp| out = Some(inflate(comp, f)))?;
        return out.expect("read_in_place calls f");
    }
    // Else copied into a buffer of the thread's, kept: a fresh one of up
    // to 32 MiB each frame cost as much in page faults as the
    // decompression.
    thread_local!(static COMP: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
    COMP.with_borrow_mut(|comp| {
        grow(comp, len, "an lz4 frame's compressed bytes")?;
        st.read_exact_at(comp, f.pos)?;
        inflate(comp, f)
    })
}

/// The frame `comp` decoded into a buffer of its own.
fn inflate(comp: &[u8], f: Lz4Frame) -> io::Result<Frame> {
    let mut out = Frame(buffer(f.len as usize)?);
    lz4frame::decode(comp, &mut out.0).map_err(|(at, why)| bad(f.pos + at as u64, why))?;
    Ok(out)
}
