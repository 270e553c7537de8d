//! Image formats: how guest bytes are laid out in a storage's bytes. Each
//! format reads any [`Storage`](crate::Storage) (a file, a file
//! over HTTP(S), memory) and names the files it refers to (a qcow2 backing
//! or data file) without opening them: `crate::open` finds and opens
//! those, beside a file or relative to a URL, and hands the format their
//! storage.
//!
//! - [`raw`]: the bytes as they are (QEMU's size, rounded up to 512).
//! - [`qcow2`]: read natively.
//! - [`vnbd`]: virtnbdbackup's streams.
//! - [`pbs`]: Proxmox Backup Server's fixed indexes.
//! - [`qemu`]: every other format QEMU reads, served by a private
//!   qemu-nbd and read over NBD: it sits here, not with the transports,
//!   because what it adds to the NBD client is a format's knowledge
//!   (probing the signatures, which files the image reads).

pub mod pbs;
pub mod qcow2;
pub mod qemu;
pub mod raw;
pub mod vnbd;
