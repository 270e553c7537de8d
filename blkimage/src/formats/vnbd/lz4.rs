//! lz4 frames of compressed streams: decompressed whole (python-lz4 links
//! a frame's blocks, so a part cannot be had alone), the last few kept.

use super::parse::{Lz4Frame, bad};
use crate::qcow2::Storage;
use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::{Arc, Mutex, OnceLock};

/// Decompressed frames kept: one per digest worker of a small machine and
/// one more. At most [`super::parse::MAX_LZ4_FRAME`] bytes each.
const KEPT: usize = 3;

type Bytes = Result<Arc<Vec<u8>>, (io::ErrorKind, String)>;
/// A frame's (stream, frame) and its bytes, once decompressed.
type Slot = ((u32, u32), Arc<OnceLock<Bytes>>);

/// The frames decompressed last, by (stream, frame). A frame asked for by
/// two threads at once is decompressed once: the second waits for it.
#[derive(Default)]
pub struct Cache {
    slots: Mutex<VecDeque<Slot>>,
}

impl Cache {
    pub fn get(
        &self,
        key: (u32, u32),
        load: impl FnOnce() -> io::Result<Vec<u8>>,
    ) -> io::Result<Arc<Vec<u8>>> {
        let cell = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            match slots.iter().position(|(k, _)| *k == key) {
                Some(i) => {
                    let slot = slots.remove(i).expect("found");
                    let cell = slot.1.clone();
                    slots.push_back(slot);
                    cell
                }
                None => {
                    let cell = Arc::new(OnceLock::new());
                    if slots.len() >= KEPT {
                        slots.pop_front();
                    }
                    slots.push_back((key, cell.clone()));
                    cell
                }
            }
        };
        cell.get_or_init(|| load().map(Arc::new).map_err(|e| (e.kind(), e.to_string())))
            .clone()
            .map_err(|(kind, msg)| io::Error::new(kind, msg))
    }
}

/// The guest bytes of lz4 frame `f`, checked against its checksums and
/// the length its header promised.
pub fn decompress(st: &dyn Storage, f: Lz4Frame) -> io::Result<Vec<u8>> {
    let mut comp = vec![0u8; f.comp as usize];
    st.read_exact_at(&mut comp, f.pos)?;
    let mut out = Vec::with_capacity(f.len as usize);
    lz4_flex::frame::FrameDecoder::new(&comp[..])
        .take(f.len as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| bad(f.pos, format!("bad lz4 frame: {e}")))?;
    if out.len() != f.len as usize {
        return Err(bad(
            f.pos,
            format!(
                "the lz4 frame holds {} bytes, its header says {}",
                out.len(),
                f.len
            ),
        ));
    }
    Ok(out)
}
