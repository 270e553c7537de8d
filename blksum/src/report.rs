//! `--json` (or `--output json`): one document for the whole run.
//!
//! ```json
//! {
//!   "schema": 1,
//!   "version": "0.1.0",
//!   "inputs": [
//!     {"name": "disk.qcow2", "format": "qcow2", "virtual-size": 1073741824,
//!      "construction": "blkhash", "digest": "sha256", "block-size": 65536,
//!      "checksum": "9f2c…",
//!      "data-bytes": 1048576, "zero-bytes": 0, "unallocated-bytes": 1072693248,
//!      "mapped-bytes": 1048576},
//!     {"name": "missing.img", "error": "No such file or directory"}
//!   ]
//! }
//! ```
//!
//! Keys are spelled as `qemu-img --output json` spells its own
//! (`virtual-size`). `schema` changes only when a key changes meaning or
//! goes away (new keys may appear); `version` is blksum's. `format` is
//! `raw`, `qcow2`, another QEMU format name, or `stream` (a pipe or standard
//! input, whose bytes are all data). `mapped-bytes` is the part of
//! `data-bytes` digested in place from memory maps (`--cache`), the rest
//! being copied. `construction` is `blkhash` (blkhash
//! 0.11's), `imageio` or `pbs` (`--construction`). Inputs are in argument
//! order. A name that is not UTF-8 has U+FFFD in `name` for the bytes that
//! are not, and the whole name, escaped, in `name-escaped` (after the
//! other keys).

use blkjob::Hashed as Report;
use serde_json::{Value, json};
use std::ffi::OsStr;
use std::io;

/// The document's schema version (see the module doc).
pub const SCHEMA: u32 = 1;

/// One input's object: `name` as text, and `name-escaped` if it is not
/// UTF-8 ([`blkcli::lines::json_escaped`]).
pub fn input(name: &OsStr, result: &io::Result<Report>) -> Value {
    let mut obj = object(&name.to_string_lossy(), result);
    if let Some(escaped) = blkcli::lines::json_escaped(name) {
        obj["name-escaped"] = escaped.into();
    }
    obj
}

fn object(name: &str, result: &io::Result<Report>) -> Value {
    match result {
        Ok(r) => json!({
            "name": name,
            "format": r.format,
            "virtual-size": r.size,
            "construction": r.checksum.construction().name(),
            "digest": r.checksum.algorithm().name(),
            "block-size": r.block_size,
            "checksum": r.checksum.to_hex(),
            "data-bytes": r.stats.data,
            "zero-bytes": r.stats.zero,
            "unallocated-bytes": r.stats.hole,
            "mapped-bytes": r.stats.mapped,
        }),
        Err(e) => json!({
            "name": name,
            "error": blkcli::units::reason(e),
        }),
    }
}

/// The whole document.
pub fn document(inputs: Vec<Value>) -> Value {
    json!({
        "schema": SCHEMA,
        "version": env!("CARGO_PKG_VERSION"),
        "inputs": inputs,
    })
}
