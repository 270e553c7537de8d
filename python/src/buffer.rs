//! The bytes of any object with the buffer protocol (bytes, bytearray,
//! memoryview, mmap, array.array, numpy arrays...), borrowed without a copy.
//!
//! PyO3's `PyBuffer` needs the stable ABI of Python 3.11, and this package
//! is built for the stable ABI of 3.9. `PyObject_GetBuffer`,
//! `PyBuffer_Release` and `Py_buffer` have had this exact layout and these
//! exported symbols in every CPython since 3.3 (3.11 only added them to the
//! stable ABI, unchanged), so they are declared here.

use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};
use std::marker::PhantomData;

/// CPython's `Py_buffer`.
#[repr(C)]
struct PyBufferView {
    buf: *mut c_void,
    obj: *mut PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

/// Contiguous bytes, whatever the item format: what hashlib asks for too.
const PYBUF_SIMPLE: c_int = 0;

unsafe extern "C" {
    fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut PyBufferView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBufferView);
}

/// An exported buffer, held until dropped (with the GIL: the `'py` lifetime
/// keeps it on the attached thread). While it is held, the exporter keeps
/// the memory in place: a bytearray or mmap cannot be resized or closed
/// ("BufferError: Existing exports of data"), so the bytes stay valid even
/// while the GIL is released.
pub struct Exported<'py> {
    view: Box<PyBufferView>,
    _py: PhantomData<Python<'py>>,
}

impl<'py> Exported<'py> {
    /// Export `obj`'s bytes: a TypeError for objects without the buffer
    /// protocol (str among them), a BufferError for non-contiguous ones.
    pub fn get(obj: &Bound<'py, PyAny>) -> PyResult<Exported<'py>> {
        // Boxed: the exporter fills the view in place and some exporters
        // keep its address in `internal`; it must not move until released.
        let mut view = Box::new(PyBufferView {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: obj is a live object (we hold a reference and the GIL);
        // the view is ours to fill.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_SIMPLE) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Exported {
            view,
            _py: PhantomData,
        })
    }

    /// The bytes as a raw slice that can cross to threads without the GIL.
    /// It is valid only while `self` is alive.
    pub fn raw(&self) -> RawSlice {
        RawSlice {
            ptr: self.view.buf as *const u8,
            len: self.view.len.max(0) as usize,
        }
    }
}

impl Drop for Exported<'_> {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and
        // is released once; the GIL is held (see the struct's lifetime).
        unsafe { PyBuffer_Release(&mut *self.view) };
    }
}

/// Borrowed bytes handed to the digest workers: a pointer and a length into
/// an [`Exported`] buffer that the caller keeps alive, unchanged, until every
/// `RawSlice` made from it is back (the hasher's `reclaim_wait`).
#[derive(Clone, Copy)]
pub struct RawSlice {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a RawSlice is only read, and its owner keeps the memory alive and
// exported (hence neither freed nor resized) while any copy exists.
unsafe impl Send for RawSlice {}
unsafe impl Sync for RawSlice {}

impl RawSlice {
    pub fn len(&self) -> usize {
        self.len
    }

    /// `self[start..end]`.
    pub fn sub(&self, start: usize, end: usize) -> RawSlice {
        assert!(start <= end && end <= self.len);
        RawSlice {
            // SAFETY: in bounds (checked above).
            ptr: if self.len == 0 {
                self.ptr
            } else {
                unsafe { self.ptr.add(start) }
            },
            len: end - start,
        }
    }
}

impl AsRef<[u8]> for RawSlice {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr..ptr+len lies in an exported buffer kept alive by its
        // owner (see the type's doc).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
