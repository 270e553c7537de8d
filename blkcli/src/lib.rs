//! What the blkhash commands (`blksum`, `blkmap`, `blkdiff`, `blksync`)
//! share, written once: checksum lines as `sha256sum` writes and reads them
//! ([`lines`]), stopping on Ctrl-C and SIGTERM ([`signals`]), and the guards
//! that keep an output from destroying data and two runs from writing one
//! destination ([`guard`]). The commands only parse, wire and print.

pub mod guard;
pub mod lines;
pub mod signals;
