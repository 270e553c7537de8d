//! blksum's command tests: each file a module, one test binary (a binary per
//! file made the test build link dozens of binaries); `vectors` stays a
//! binary of its own, which the arm64 step runs alone under emulation.

mod common;

mod checkpoint;
mod checkpoint_record;
mod cli;
mod compressed;
mod http;
mod imageio;
mod kubevirt;
mod limits;
mod locks;
mod nbd;
mod nbd_formats;
mod nbd_tls;
mod progress;
mod qcow2;
mod qcow2_corrupt;
mod readpath;
mod rounding;
mod shrink;
mod signals;
mod verify;
mod vnbd;
