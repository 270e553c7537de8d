//! Merging parts into a map, as a stream: parts are read a piece at a time
//! and the map written as it goes, so memory stays bounded (about 1 MiB
//! per part plus write buffers) whatever the image's size.

use crate::format::{Header, MapReader, Piece, write_atomic};
use crate::writer::{Output, RecordWriter};
use crate::{MapError, Outer, Range, zero_digest};
use blkhash::{Algorithm, Checksum, Construction};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// What a merge reads a part from: it reads each part twice (see
/// [`merge`]), so it must seek. Files and `Cursor`s are.
pub trait Input: Read + Seek {}
impl<T: Read + Seek> Input for T {}

/// An input of a merge: a name for messages, and the part's bytes.
pub type Named<'a> = (String, Box<dyn Input + 'a>);

/// Merge the parts `inputs` (a name for messages, and the part's bytes)
/// into one map, written to `out` if given; return the header of the
/// result, whose checksum is the image's when the parts cover it all.
///
/// The parts must agree on size, digest and block size and cover the
/// image exactly once, in any order (`allow_partial`: cover one range
/// without a gap, which then gives a part, not a map). Each part is read
/// through and checked (lengths, trailer) before any is merged: hashing
/// the digests of a part's zero runs costs one digest per block, so a
/// damaged part that claims a huge sparse range is refused before that
/// work, not after it. A complete map given alone has its checksum
/// checked. `identity` is recorded in the result; without one, the
/// identity every part carries, if they all carry the same (parts hashed
/// from one unchanged image), else none.
///
/// The result is the map a single run would have written, byte for byte:
/// runs of one kind that meet at a boundary between parts are one record.
pub fn merge(
    inputs: Vec<Named<'_>>,
    out: Option<&mut dyn Output>,
    identity: Option<Vec<u8>>,
    allow_partial: bool,
) -> Result<Header, MapError> {
    merge_until(
        inputs,
        out,
        identity,
        allow_partial,
        &AtomicBool::new(false),
    )
}

/// [`merge`], stopped with an [`io::ErrorKind::Interrupted`] error soon
/// after `cancel` is set: a part may claim an image of up to 2^64 bytes of
/// zeros, whose checksum takes one digest per block to compute.
pub fn merge_until(
    inputs: Vec<Named<'_>>,
    out: Option<&mut dyn Output>,
    identity: Option<Vec<u8>>,
    allow_partial: bool,
    cancel: &AtomicBool,
) -> Result<Header, MapError> {
    merge_in(
        inputs,
        out,
        identity,
        allow_partial,
        Construction::Blkhash,
        cancel,
    )
}

/// The checksum in `construction` of the map or parts `parts` (files, as
/// [`merge_files`] reads them), nothing written: a map keeps blkhash
/// 0.11's checksum, and the others follow from its block digests.
pub fn checksum_files_until(
    parts: &[impl AsRef<Path>],
    construction: Construction,
    cancel: &AtomicBool,
) -> Result<Header, MapError> {
    merge_in(open_parts(parts)?, None, None, false, construction, cancel)
}

/// The files `parts`, opened as maps to merge, each named by its path.
fn open_parts(parts: &[impl AsRef<Path>]) -> Result<Vec<Named<'static>>, MapError> {
    let mut inputs: Vec<Named<'static>> = Vec::with_capacity(parts.len());
    for p in parts {
        let p = p.as_ref();
        let name = p.display().to_string();
        let f = crate::format::open_map_file(p).map_err(|e| MapError::Io(e).of(&name))?;
        inputs.push((name, Box::new(BufReader::new(f))));
    }
    Ok(inputs)
}

/// [`merge_until`], the checksum computed in `construction` (only
/// blkhash 0.11's is written to a map: give no `out` with another).
fn merge_in(
    inputs: Vec<Named<'_>>,
    out: Option<&mut dyn Output>,
    identity: Option<Vec<u8>>,
    allow_partial: bool,
    construction: Construction,
    cancel: &AtomicBool,
) -> Result<Header, MapError> {
    debug_assert!(out.is_none() || construction == Construction::Blkhash);
    let mut parts = read_parts(inputs)?;
    let identity = identity.or_else(|| common_identity(&parts));
    let want = parts[0].1.header().clone();
    let range = check_coverage(&mut parts, want.size, allow_partial)?;
    let complete = range.offset == 0 && range.end() == want.size;
    let alone = parts.len() == 1;
    let claimed = parts[0].1.header().checksum.clone();

    // Only a merge that covers the image has a checksum to compute: a
    // checkpoint's saves (partial) skip the outer digest.
    let mut outer = complete.then(|| {
        Outer::new(
            want.algorithm,
            &zero_digest(want.algorithm, want.block_size),
        )
    });
    let mut header = Header {
        range,
        // Filled in at the end: the writer patches it.
        checksum: complete.then(|| placeholder(want.algorithm)),
        identity,
        ..want
    };
    header.check()?;
    let mut writer = match out {
        Some(w) => Some(RecordWriter::new(w, &header)?),
        None => None,
    };
    copy_pieces(&mut parts, outer.as_mut(), writer.as_mut(), cancel)?;
    if let Some(outer) = outer {
        let checksum = outer.checksum_with(construction, want.size);
        // A map holds blkhash 0.11's checksum: only that one can be
        // compared (its trailer's SHA-256 guards the rest either way).
        let ours = construction == Construction::Blkhash;
        if ours && alone && claimed.as_ref().is_some_and(|c| *c != checksum) {
            return Err(MapError::Checksum.of(&parts[0].0));
        }
        header.checksum = Some(checksum);
    }
    if let Some(w) = writer {
        w.finish(&header)?;
    }
    Ok(header)
}

/// The identity all `parts` record, if they record one and the same.
fn common_identity(parts: &[Part<'_>]) -> Option<Vec<u8>> {
    let first = parts.first()?.1.header().identity.clone()?;
    (parts.iter())
        .all(|(_, r)| r.header().identity.as_ref() == Some(&first))
        .then_some(first)
}

/// A checksum of zeros, in place of the one computed at the end (the
/// writer patches it).
pub(crate) fn placeholder(algorithm: Algorithm) -> Checksum {
    let zeros = vec![0u8; algorithm.output_len()];
    Checksum::from_bytes(algorithm, &zeros).expect("a digest of the algorithm's length")
}

/// A part being merged: its name for messages, and its reader.
type Part<'a> = (String, MapReader<Box<dyn Input + 'a>>);

/// The first phase of a merge: each input read through and checked
/// ([`checked`]), at least one, all of one image (size, digest and block
/// size).
fn read_parts(inputs: Vec<Named<'_>>) -> Result<Vec<Part<'_>>, MapError> {
    let mut parts = Vec::with_capacity(inputs.len());
    for (name, r) in inputs {
        let reader = checked(r).map_err(|e| e.of(&name))?;
        parts.push((name, reader));
    }
    let Some((first_name, first)) = parts.first() else {
        return Err(MapError::Merge("no parts to merge".into()));
    };
    let want = first.header();
    for (name, r) in &parts[1..] {
        let h = r.header();
        if (h.algorithm, h.block_size, h.size) != (want.algorithm, want.block_size, want.size) {
            return Err(MapError::Merge(format!(
                "{name} is {} and {first_name} is {}: parts of one image agree on both",
                describe(h),
                describe(want)
            )));
        }
    }
    Ok(parts)
}

/// The second phase: `parts` sorted by their ranges, which must cover an
/// image of `size` bytes exactly once (`allow_partial`: one range, from
/// the first part's start, without a gap). The range covered.
fn check_coverage(
    parts: &mut [Part<'_>],
    size: u64,
    allow_partial: bool,
) -> Result<Range, MapError> {
    // A zero-length part covers nothing: it sorts first among equals and
    // is skipped by the coverage check.
    parts.sort_by_key(|(_, r)| (r.header().range.offset, r.header().range.end()));
    let start = if allow_partial {
        parts[0].1.header().range.offset
    } else {
        0
    };
    let mut covered = start;
    let mut last: Option<&str> = None;
    for (name, r) in parts.iter() {
        let Range { offset, len } = r.header().range;
        if len == 0 {
            continue;
        }
        if offset > covered {
            return Err(MapError::Merge(format!(
                "a gap: bytes {covered}+{} are in no part ({})",
                offset - covered,
                match last {
                    Some(prev) => format!("{prev} ends at {covered}, {name} starts at {offset}"),
                    None => format!("the first part, {name}, starts at {offset}"),
                }
            )));
        }
        if offset < covered {
            return Err(MapError::Merge(format!(
                "an overlap: {} and {name} both cover bytes {offset}+{}",
                last.unwrap_or("?"),
                covered.min(offset + len) - offset
            )));
        }
        covered = offset + len;
        last = Some(name);
    }
    if covered < size && !allow_partial {
        return Err(MapError::Merge(format!(
            "a gap: bytes {covered}+{} are in no part (the last part{} ends at {covered}, the image at {size})",
            size - covered,
            last.map(|n| format!(", {n},")).unwrap_or_default(),
        )));
    }
    Ok(Range {
        offset: start,
        len: covered - start,
    })
}

/// The third phase: every piece of `parts`, in order, into the outer
/// digest and the writer (each if any).
fn copy_pieces(
    parts: &mut [Part<'_>],
    mut outer: Option<&mut Outer>,
    mut writer: Option<&mut RecordWriter<&mut dyn Output>>,
    cancel: &AtomicBool,
) -> Result<(), MapError> {
    for (name, r) in parts.iter_mut() {
        let of = |e: MapError| e.of(name);
        while let Some(piece) = r.next_piece().map_err(of)? {
            match piece {
                Piece::Zeros(n) => {
                    if let Some(o) = &mut outer {
                        o.zeros_until(n, cancel)?;
                    }
                    if let Some(w) = &mut writer {
                        w.zeros(n)?;
                    }
                }
                Piece::Data(d) => {
                    if let Some(o) = &mut outer {
                        o.data(d);
                    }
                    if let Some(w) = &mut writer {
                        w.data(d)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Read `r` through as a map (every check but the derived checksum), then
/// again from its start: the reader of the second pass.
fn checked<'a>(r: Box<dyn Input + 'a>) -> Result<MapReader<Box<dyn Input + 'a>>, MapError> {
    let mut reader = MapReader::new(r)?;
    while reader.next_piece()?.is_some() {}
    let mut r = reader.into_inner();
    r.seek(SeekFrom::Start(0))?;
    MapReader::new(r)
}

fn describe(h: &Header) -> String {
    format!(
        "of a {}-byte image in {} digests of {}-byte blocks",
        h.size, h.algorithm, h.block_size
    )
}

/// [`merge`] the part files `parts` into the map `out` (written
/// atomically, as [`Map::save`](crate::Map::save) does), or, without
/// `out`, only compute the checksum. `out` must be a map, an empty file or
/// a missing one, and none of the parts ([`crate::guard`]): anything else
/// is refused before a part is read.
pub fn merge_files(parts: &[impl AsRef<Path>], out: Option<&Path>) -> Result<Header, MapError> {
    merge_files_until(parts, out, &AtomicBool::new(false))
}

/// [`merge_files`], stopped soon after `cancel` is set (as [`merge_until`]);
/// `out` is then left as it was, and no temporary file stays behind.
pub fn merge_files_until(
    parts: &[impl AsRef<Path>],
    out: Option<&Path>,
    cancel: &AtomicBool,
) -> Result<Header, MapError> {
    if let Some(out) = out {
        let inputs: Vec<_> = parts
            .iter()
            .map(|p| crate::guard::Input {
                name: p.as_ref().as_os_str(),
                role: "a part",
            })
            .collect();
        crate::guard::check_outputs(&[crate::guard::Output::map(out)], &inputs)?;
    }
    let inputs = open_parts(parts)?;
    match out {
        Some(out) => merge_to_file_until(inputs, out, None, false, cancel),
        None => merge_until(inputs, None, None, false, cancel),
    }
}

/// [`merge`] into the file `out`, written atomically (as
/// [`Map::save`](crate::Map::save) does): `out` is the old file or the
/// new one, never a part of one, and is left as it was on an error. An
/// input may be `out` itself, opened before: it is read whole before the
/// new file replaces it. `out` is checked as a map output
/// ([`crate::guard`]: a map, an empty file or a missing one, not a link or
/// a device) first; the caller checks it against the inputs.
pub fn merge_to_file(
    inputs: Vec<Named<'_>>,
    out: &Path,
    identity: Option<Vec<u8>>,
    allow_partial: bool,
) -> Result<Header, MapError> {
    merge_to_file_until(
        inputs,
        out,
        identity,
        allow_partial,
        &AtomicBool::new(false),
    )
}

/// [`merge_to_file`], stopped soon after `cancel` is set.
pub fn merge_to_file_until(
    inputs: Vec<Named<'_>>,
    out: &Path,
    identity: Option<Vec<u8>>,
    allow_partial: bool,
    cancel: &AtomicBool,
) -> Result<Header, MapError> {
    crate::guard::check_outputs(&[crate::guard::Output::map(out)], &[])?;
    let mut result = None;
    let written = write_atomic(out, |w| {
        w.flush()?;
        match merge_until(inputs, Some(w.get_mut()), identity, allow_partial, cancel) {
            Ok(h) => {
                result = Some(Ok(h));
                Ok(())
            }
            Err(e) => {
                let msg = e.to_string();
                result = Some(Err(e));
                Err(io::Error::other(msg))
            }
        }
    });
    match (result, written) {
        (Some(Err(e)), _) => Err(e),
        (_, Err(e)) => Err(MapError::Io(e)),
        (Some(Ok(h)), Ok(())) => Ok(h),
        (None, Ok(())) => unreachable!("the closure ran"),
    }
}
