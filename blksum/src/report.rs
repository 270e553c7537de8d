//! `--json`: one document for the whole run.
//!
//! ```json
//! {
//!   "version": "0.1.0",
//!   "inputs": [
//!     {"name": "disk.qcow2", "format": "qcow2", "virtual_size": 1073741824,
//!      "digest": "sha256", "block_size": 65536, "checksum": "9f2c…",
//!      "data_bytes": 1048576, "zero_bytes": 0, "unallocated_bytes": 1072693248},
//!     {"name": "missing.img", "error": "No such file or directory"}
//!   ]
//! }
//! ```
//!
//! `format` is `raw`, `qcow2`, or `stream` (a pipe or standard input, whose
//! bytes are all data). Inputs are in argument order.

use crate::hashing::Report;
use serde_json::{Value, json};
use std::io;

/// One input's object.
pub fn input(name: &str, result: &io::Result<Report>) -> Value {
    match result {
        Ok(r) => json!({
            "name": name,
            "format": r.format,
            "virtual_size": r.size,
            "digest": r.checksum.algorithm().name(),
            "block_size": r.block_size,
            "checksum": r.checksum.to_hex(),
            "data_bytes": r.stats.data,
            "zero_bytes": r.stats.zero,
            "unallocated_bytes": r.stats.hole,
        }),
        Err(e) => json!({
            "name": name,
            "error": crate::output::reason(e),
        }),
    }
}

/// The whole document.
pub fn document(inputs: Vec<Value>) -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "inputs": inputs,
    })
}
