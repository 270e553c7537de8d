//! Where the bytes come from: images as [`Source`]s, streams, and the reader
//! that takes them to a [`Sink`] in guest order.
//!
//! The crate is in three layers, each importing only from those below it
//! (`scripts/check-imports.py` checks it):
//!
//! - `storage/`: where bytes come from. A file or block device (read with
//!   pread, direct I/O, or in place from memory maps: [`RawFile`],
//!   [`mapped`]), a file over HTTP(S) ([`http`]), an NBD export
//!   ([`nbd`]), a gzip, xz or zstd file read forward ([`compressed`]).
//!   Formats read them through the [`Storage`] trait; a transport decides
//!   ranges, connections and retries, never a format.
//! - `formats/`: how guest bytes lie in a storage: raw, [`qcow2`], and the
//!   formats QEMU reads (served by a private qemu-nbd: [`QemuExport`]).
//!   A format names the files it refers to but never opens them.
//! - `open/`: [`open`] turns a name into an [`Input`]: it probes the first
//!   bytes (or takes [`OpenOptions::format`]), finds the chain an image
//!   names (a qcow2 backing or data file beside a file or relative to a
//!   URL), opens each part on its storage and hands it to its format.
//!
//! Beside them, at the crate's root: [`Source`], the one trait every
//! image implements (`source.rs` states its contract, and
//! [`Source::origin`] says where the bytes came from), dirty bitmaps
//! ([`Dirty`]), the source adapters [`Window`] and [`Masked`], and the
//! reader ([`read_image`], [`ReadAhead`]) that hands extents to a
//! [`Sink`] in guest order. A reader starts at [`open`] and
//! [`read_image`]; a new format goes in `formats/` (and its probe in
//! `open/`), a new transport in `storage/` (its [`Source::origin`] is all a
//! record needs).
//!
//! ```no_run
//! use blkimage::{open, Input, OpenOptions};
//! let input = open("disk.img", &OpenOptions::default()).unwrap();
//! if let Input::Image(src) = input {
//!     println!("{} bytes of {}", src.size(), src.format());
//! }
//! ```

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]

mod bitmap;
mod buffer;
pub mod formats;
mod masked;
mod open;
mod oserror;
mod readahead;
mod reader;
mod sink;
mod source;
mod storage;
mod window;

pub use bitmap::{BitmapInfo, Dirty, MAX_DIRTY_RANGES};
pub use buffer::{ALIGN, AlignedBuf};
/// Proxmox Backup Server: the fixed index and its datastore
/// ([`formats::pbs`]), and how a backup's key is loaded and checked
/// against its manifest.
pub mod pbs {
    pub use crate::formats::pbs::image::PbsImage;
    pub use crate::formats::pbs::*;
    pub use crate::open::pbs::{PASSWORD_ENV, check_manifest, load_key, open_image};
}
pub use formats::qcow2;
pub use formats::qcow2::Qcow2;
/// The formats read through a private qemu-nbd (QEMU's driver names), for
/// `--format` and its completions.
pub use formats::qemu::FORMATS as QEMU_FORMATS;
pub use formats::qemu::{PassphraseNeeded, QemuExport, QemuTarget, probe_format};
pub use masked::Masked;
pub use open::{Format, Input, OpenOptions, open, unknown_scheme};
pub use oserror::{cause, caused_by, errno, file, with_context, with_file};
pub use readahead::ReadAhead;
pub use reader::{
    DEFAULT_IO_DEPTH, DIRECT_BYTES_IN_FLIGHT, InputRead, Stats, direct_io_depth, interrupted,
    io_depth_for, read_image, read_input, read_stream,
};
pub use sink::{Fill, Lend, Sink};
pub use source::{Decompressed, Extent, ExtentKind, Origin, Remote, Role, Rounded, Source};
pub use storage::{MapReads, RawFile, Storage, compressed, http, mapped, nbd};
pub use window::Window;
