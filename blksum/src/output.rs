//! Error messages.

pub use blkimage::units::reason;
