//! Guest offsets to host clusters: the L1 and L2 tables, standard and
//! extended (subcluster) L2 entries.

use super::header::Header;
use super::invalid;
use super::l2cache::{L2Cache, Table};
use crate::storage::Storage;
use std::io;

/// Bits 9-55 of an L1 or standard L2 entry: a host offset.
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const COMPRESSED: u64 = 1 << 62;
const COPIED: u64 = 1 << 63;
const ZERO: u64 = 1;

/// What a run of guest bytes maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Map {
    /// Not allocated here: the backing image's bytes, or zeros.
    Unallocated,
    /// Reads as zeros.
    Zero,
    /// Host bytes from `host` on (in the data file), contiguous for the run.
    Data { host: u64 },
    /// Part of a compressed cluster: `len` bytes at `host` in the image
    /// file inflate to the guest cluster starting at `cluster`.
    Compressed { host: u64, len: u64, cluster: u64 },
}

/// The geometry and tables of an image.
pub struct Mapper {
    pub cluster_bits: u32,
    l2_bits: u32,
    extended: bool,
    external_data: bool,
    l1: Vec<u64>,
    cache: L2Cache,
    /// Length of the image file (for tables and compressed clusters).
    file_len: u64,
    /// Length of the data file (for data clusters).
    data_len: u64,
    /// Bits of a compressed descriptor.
    csize_shift: u32,
    csize_mask: u64,
}

impl Mapper {
    /// Load the L1 table (validated by the header: inside the file, at most 32 MiB).
    pub fn new(h: &Header, file: &dyn Storage, data_len: u64) -> io::Result<Mapper> {
        let mut bytes = blkhash::try_zeroed(h.l1_size as usize * 8, "the L1 table")?;
        file.read_exact_at(&mut bytes, h.l1_offset)?;
        let l1 = bytes
            .chunks_exact(8)
            .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let csize_shift = 62 - (h.cluster_bits - 8);
        Ok(Mapper {
            cluster_bits: h.cluster_bits,
            l2_bits: h.l2_bits(),
            extended: h.extended_l2,
            external_data: h.external_data,
            l1,
            cache: L2Cache::new(h.cluster_size()),
            file_len: file.len(),
            data_len,
            csize_shift,
            csize_mask: (1 << (h.cluster_bits - 8)) - 1,
        })
    }

    fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// The L1 index of guest offset `g`.
    pub fn l1_index(&self, g: u64) -> u64 {
        g >> (self.cluster_bits + self.l2_bits)
    }

    /// True if the first data cluster of the first L2 table is compressed
    /// (one table read): an image made with `qemu-img convert -c`, whose
    /// reads are decompression, CPU work. False if there is none, or on an
    /// error (the reads will report it).
    pub fn looks_compressed(&self, file: &dyn Storage) -> bool {
        let table_bytes = 1u64 << (self.cluster_bits + self.l2_bits);
        let Some(i) = self.l1.iter().position(|e| e & OFFSET_MASK != 0) else {
            return false;
        };
        let start = i as u64 * table_bytes;
        let mut g = start;
        while g < start + table_bytes {
            match self.map(file, g, start + table_bytes - g) {
                Ok((Map::Compressed { .. }, _)) => return true,
                Ok((Map::Data { .. }, _)) | Err(_) => return false,
                Ok((_, len)) => g += len,
            }
        }
        false
    }

    /// True if `g` is covered by an allocated L2 table.
    pub fn has_table(&self, g: u64) -> bool {
        usize::try_from(self.l1_index(g))
            .ok()
            .and_then(|i| self.l1.get(i))
            .is_some_and(|e| e & OFFSET_MASK != 0)
    }

    /// What guest offset `g` maps to, and for how many bytes (at least 1, at
    /// most `max`, never past the end of `g`'s L2 table). Data runs are
    /// contiguous on the host; compressed runs stay within one cluster.
    pub fn map(&self, file: &dyn Storage, g: u64, max: u64) -> io::Result<(Map, u64)> {
        debug_assert!(max > 0);
        let table_shift = self.cluster_bits + self.l2_bits;
        let table_start = (g >> table_shift) << table_shift;
        let limit = table_start
            .checked_add(1 << table_shift)
            .map_or(u64::MAX, |e| e)
            .min(g.saturating_add(max));
        let l1e = usize::try_from(self.l1_index(g))
            .ok()
            .and_then(|i| self.l1.get(i))
            .copied()
            .unwrap_or(0);
        let l2_offset = l1e & OFFSET_MASK;
        if l2_offset == 0 {
            return Ok((Map::Unallocated, limit - g));
        }
        let cs = self.cluster_size();
        if l2_offset & (cs - 1) != 0 {
            return Err(invalid(format!(
                "L2 table offset {l2_offset:#x} is not aligned to the cluster size (guest offset {g:#x})"
            )));
        }
        if l2_offset.checked_add(cs).is_none_or(|e| e > self.file_len) {
            return Err(invalid(format!(
                "L2 table at offset {l2_offset:#x} is beyond the end of the file"
            )));
        }
        let table = self.cache.get(file, l2_offset)?;

        let unit_bits = if self.extended {
            self.cluster_bits - 5
        } else {
            self.cluster_bits
        };
        let first = self.classify(&table, g)?;
        let mut pos = ((g >> unit_bits) + 1) << unit_bits;
        if let Map::Compressed { .. } = first {
            // Each compressed cluster is its own run.
            pos = ((g >> self.cluster_bits) + 1) << self.cluster_bits;
        } else {
            while pos < limit {
                let next = self.classify(&table, pos)?;
                let same = match (first, next) {
                    (Map::Data { host: a }, Map::Data { host: b }) => {
                        a.checked_add(pos - g) == Some(b)
                    }
                    (Map::Unallocated, Map::Unallocated) | (Map::Zero, Map::Zero) => true,
                    _ => false,
                };
                if !same {
                    break;
                }
                pos += 1 << unit_bits;
            }
        }
        let len = pos.min(limit) - g;
        if let Map::Data { host } = first
            && host.checked_add(len).is_none_or(|e| e > self.data_len)
        {
            return Err(invalid(format!(
                "data cluster at host offset {host:#x} (guest offset {g:#x}) is beyond the end of the {}",
                if self.external_data {
                    "data file"
                } else {
                    "file"
                }
            )));
        }
        Ok((first, len))
    }

    /// The mapping of the (sub)cluster holding `g`; for data, the host
    /// offset of `g` itself.
    fn classify(&self, table: &Table, g: u64) -> io::Result<Map> {
        let cs = self.cluster_size();
        let index = ((g >> self.cluster_bits) & ((1 << self.l2_bits) - 1)) as usize;
        let (entry, bitmap) = if self.extended {
            (table[2 * index], table[2 * index + 1])
        } else {
            (table[index], 0)
        };
        let in_cluster = g & (cs - 1);
        if entry & COMPRESSED != 0 {
            return self.compressed(entry, g);
        }
        let host = entry & OFFSET_MASK;
        let allocated = host != 0 || (self.external_data && entry & COPIED != 0);
        if host & (cs - 1) != 0 {
            return Err(invalid(format!(
                "data cluster offset {host:#x} is not aligned to the cluster size (guest offset {g:#x})"
            )));
        }
        let (zero, alloc) = if self.extended {
            let sub = in_cluster >> (self.cluster_bits - 5);
            let alloc = bitmap & (1 << sub) != 0;
            let zero = bitmap & (1 << (32 + sub)) != 0;
            if alloc && zero {
                return Err(invalid(format!(
                    "subcluster {sub} at guest offset {g:#x} is both allocated and zero"
                )));
            }
            if alloc && !allocated {
                return Err(invalid(format!(
                    "subcluster {sub} at guest offset {g:#x} is allocated in a cluster without a host offset"
                )));
            }
            (zero, alloc)
        } else {
            (entry & ZERO != 0, allocated)
        };
        Ok(if zero {
            Map::Zero
        } else if alloc {
            Map::Data {
                host: host + in_cluster,
            }
        } else {
            Map::Unallocated
        })
    }

    fn compressed(&self, entry: u64, g: u64) -> io::Result<Map> {
        if self.external_data {
            return Err(invalid(format!(
                "compressed cluster (guest offset {g:#x}) in an image with an external data file"
            )));
        }
        let host = entry & ((1 << self.csize_shift) - 1);
        let sectors = ((entry >> self.csize_shift) & self.csize_mask) + 1;
        let len = sectors * 512 - (host & 511);
        // The last sector may pass the end of the file, as QEMU writes it;
        // the compressed bytes themselves must be inside.
        let file_end = self
            .file_len
            .checked_next_multiple_of(512)
            .unwrap_or(u64::MAX);
        if host >= self.file_len || host.checked_add(len).is_none_or(|e| e > file_end) {
            return Err(invalid(format!(
                "compressed cluster at host offset {host:#x} ({len} bytes, guest offset {g:#x}) is beyond the end of the file"
            )));
        }
        let len = len.min(self.file_len - host);
        Ok(Map::Compressed {
            host,
            len,
            cluster: (g >> self.cluster_bits) << self.cluster_bits,
        })
    }
}
