//! Image formats blkimage reads itself, each over any storage.

pub mod vnbd;
