//! blkmap's, blkdiff's and blksync's command tests: each file a module, one
//! test binary (a binary per file made the test build link dozens of them).

mod common;

mod bounded;
mod cli;
mod closed_stdout;
mod compressed;
mod crash;
mod dirty;
mod fidx;
mod guard;
mod http;
mod interrupted;
mod keyed;
mod kubevirt;
mod libvirt;
mod libvirt_page;
mod limits;
mod luks;
mod manual;
mod merge_signals;
mod names;
mod nbd;
mod ranges;
mod rounding;
mod src_written;
mod sync;
mod unaligned;
mod unmarked;
mod wording;
