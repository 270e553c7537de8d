//! A bounded cache of L2 tables, shared by the reading threads.

use super::invalid;
use crate::storage::Storage;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

/// The cache holds at most this many bytes of tables...
const MAX_BYTES: u64 = 32 << 20;
/// ...and at most this many tables (eviction scans them all).
const MAX_TABLES: usize = 4096;

/// An L2 table: its entries, decoded from big endian.
pub type Table = Arc<[u64]>;

struct Entry {
    table: Table,
    used: u64,
}

#[derive(Default)]
struct Inner {
    tables: HashMap<u64, Entry>,
    clock: u64,
}

pub struct L2Cache {
    cluster_size: u64,
    capacity: usize,
    inner: Mutex<Inner>,
}

impl L2Cache {
    pub fn new(cluster_size: u64) -> L2Cache {
        let capacity = ((MAX_BYTES / cluster_size) as usize).clamp(4, MAX_TABLES);
        L2Cache {
            cluster_size,
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The L2 table at `offset` in `file` (already checked: aligned, inside the file).
    pub fn get(&self, file: &dyn Storage, offset: u64) -> io::Result<Table> {
        {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            if let Some(e) = inner.tables.get_mut(&offset) {
                e.used = now;
                return Ok(e.table.clone());
            }
        }
        // Read without holding the lock: other threads keep going. Two
        // threads may read the same table; both results are the same.
        let mut bytes = blkhash::try_zeroed(self.cluster_size as usize, "an L2 table")?;
        file.read_exact_at(&mut bytes, offset).map_err(|e| {
            invalid(format!(
                "cannot read the L2 table at offset {offset:#x}: {e}"
            ))
        })?;
        let table: Table = bytes
            .chunks_exact(8)
            .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let mut inner = self.lock();
        if inner.tables.len() >= self.capacity
            && let Some(&old) = inner
                .tables
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k)
        {
            inner.tables.remove(&old);
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.tables.insert(
            offset,
            Entry {
                table: table.clone(),
                used,
            },
        );
        Ok(table)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the map inconsistent: keep using it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded() {
        let cs = 512u64;
        let mut file = vec![0u8; (cs * 5000) as usize];
        for i in 0..5000u64 {
            file[(i * cs) as usize..][..8].copy_from_slice(&i.to_be_bytes());
        }
        let cache = L2Cache::new(cs);
        for i in 0..5000u64 {
            let t = cache.get(&file, i * cs).unwrap();
            assert_eq!(t[0], i);
            assert_eq!(t.len(), 64);
        }
        assert_eq!(cache.lock().tables.len(), MAX_TABLES);
        // The most recent are still there.
        assert!(cache.lock().tables.contains_key(&(4999 * cs)));
        assert!(!cache.lock().tables.contains_key(&0));
    }
}
