//! A Proxmox Backup Server datastore as storage: the chunks a backup's
//! index names, each the bytes of one digest ([`ChunkStore`]): a blob
//! ([`blob`]: CRC, zstd, AES-256-GCM) checked against its digest, plain
//! or keyed ([`Key`], from a key file: [`keyfile`]).
//!
//! The facts come from proxmox-backup's published format
//! (`docs/file-formats.rst`) and its source (`pbs-tools`'
//! `crypt_config.rs`, `pbs-key-config`, `pbs-datastore`'s `data_blob.rs`);
//! the tests check them against the vectors proxmox-backup's own tests
//! publish.

pub mod blob;
mod chunks;
mod key;
pub mod keyfile;

pub use chunks::ChunkStore;
pub use key::Key;
