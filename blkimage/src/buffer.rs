//! Page-aligned I/O buffers, as direct I/O needs.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer: a page, which satisfies direct I/O on any
/// device with logical blocks up to 4 KiB.
pub const ALIGN: usize = 4096;

/// A heap buffer aligned to [`ALIGN`], with a capacity fixed at creation and
/// a length of valid bytes (what it derefs to).
///
/// ```
/// use blkimage::AlignedBuf;
/// let mut b = AlignedBuf::new(8192);
/// assert_eq!(b.len(), 0);
/// b.spare()[..3].copy_from_slice(b"abc");
/// b.set_len(3);
/// assert_eq!(&b[..], b"abc");
/// assert_eq!(b.as_ptr() as usize % 4096, 0);
/// ```
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: the buffer owns its memory exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `capacity` bytes (rounded up to [`ALIGN`]),
    /// empty. Aborts if the memory cannot be had, as a `Vec` does:
    /// [`try_new`](AlignedBuf::try_new) is the run's way.
    pub fn new(capacity: usize) -> Self {
        let cap = capacity.max(1).next_multiple_of(ALIGN);
        let layout = Layout::from_size_align(cap, ALIGN).expect("buffer size overflows");
        Self::alloc(layout).unwrap_or_else(|| alloc::handle_alloc_error(layout))
    }

    /// [`new`](AlignedBuf::new), or the error "cannot allocate N bytes for
    /// WHAT" if the memory cannot be had (a `ulimit -v`, a cgroup's limit).
    ///
    /// ```
    /// use blkimage::AlignedBuf;
    /// assert_eq!(AlignedBuf::try_new(100, "a read").unwrap().capacity(), 4096);
    /// let err = AlignedBuf::try_new(usize::MAX / 2, "a read").err().unwrap();
    /// assert!(err.to_string().starts_with("cannot allocate "), "{err}");
    /// ```
    pub fn try_new(capacity: usize, what: &str) -> std::io::Result<Self> {
        let cap = capacity.max(1).next_multiple_of(ALIGN);
        let room = blkhash::room(cap);
        Layout::from_size_align(cap, ALIGN)
            .ok()
            .filter(|_| room.is_some())
            .and_then(Self::alloc)
            .ok_or_else(|| blkhash::out_of_memory(cap, what))
    }

    fn alloc(layout: Layout) -> Option<Self> {
        // SAFETY: layout has a non-zero size. Zeroed memory keeps every byte
        // initialised, so spare() can hand out &mut [u8] safely.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(AlignedBuf {
            ptr,
            cap: layout.size(),
            len: 0,
        })
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The whole capacity, to fill before [`set_len`](AlignedBuf::set_len).
    pub fn spare(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap initialised bytes, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// Set how many bytes are valid. Panics past the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "length {len} past capacity {}", self.cap);
        self.len = len;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, ALIGN).unwrap();
        // SAFETY: allocated in new() with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: len <= cap, memory initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: len <= cap, memory initialised, &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}
