//! Error messages.

pub use blkcli::units::reason;
