//! Where the bytes come from: images as [`Source`]s, streams, and the reader
//! that takes them to a [`Sink`] in guest order.
//!
//! ```no_run
//! use blkimage::{open, Input, OpenOptions};
//! let input = open("disk.img", &OpenOptions::default()).unwrap();
//! if let Input::Image(src) = input {
//!     println!("{} bytes of {}", src.size(), src.format());
//! }
//! ```

mod buffer;
mod raw;
mod reader;
mod source;

pub use buffer::{ALIGN, AlignedBuf};
pub use raw::RawFile;
pub use reader::{ReadOptions, Sink, Stats, interrupted, read_image, read_stream};
pub use source::{Extent, ExtentKind, Source};

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// How to open inputs.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Use the page cache (else direct I/O where the file system allows it).
    pub cache: bool,
}

/// An opened input.
pub enum Input {
    /// Random access, with a size and a map of its extents.
    Image(Box<dyn Source>),
    /// Read once from start to end (a pipe, standard input, a FIFO).
    Stream(Box<dyn Read + Send>),
}

/// Open `name`: `-` is standard input; a regular file or block device is an
/// image; a FIFO or character device is a stream.
pub fn open(name: &str, opts: &OpenOptions) -> io::Result<Input> {
    if name == "-" {
        return Ok(Input::Stream(Box::new(io::stdin())));
    }
    let path = Path::new(name);
    let ft = std::fs::metadata(path)?.file_type();
    if ft.is_fifo() || ft.is_char_device() || ft.is_socket() {
        return Ok(Input::Stream(Box::new(File::open(path)?)));
    }
    Ok(Input::Image(Box::new(RawFile::open(path, !opts.cache)?)))
}
