//! blkimage's tests against real images and servers: each file a module, one
//! test binary (a binary per file made the test build link one each).

mod common;

mod chain;
mod http;
mod nbd;
mod nbd_bitmaps;
mod nbd_hostile;
mod pbs;
mod qcow2;
mod qcow2_bitmaps;
mod reader;
