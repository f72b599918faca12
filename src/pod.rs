//! Messages of plain-old-data elements ([`bytemuck::Pod`]): their bytes, the check that a
//! received length is a whole number of elements, and the owned buffer of a request with its
//! element type taken off.

use bytemuck::Pod;
use polyrail_core::engine::Status;
use polyrail_core::{Error, Result};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

/// The bytes of `items` (none for a zero-sized type).
#[inline]
pub(crate) fn bytes<T: Pod>(items: &[T]) -> &[u8] {
    // Constant per `T`: no branch is left in the compiled call.
    if size_of::<T>() == 0 {
        &[]
    } else {
        // Never fails: no alignment is needed and every length is a whole number of bytes.
        bytemuck::cast_slice(items)
    }
}

/// The bytes of `items`, to receive into (none for a zero-sized type).
#[inline]
pub(crate) fn bytes_mut<T: Pod>(items: &mut [T]) -> &mut [u8] {
    if size_of::<T>() == 0 {
        &mut []
    } else {
        bytemuck::cast_slice_mut(items)
    }
}

/// `status`, when its length is a whole number of `T`s; else an [`Error::InvalidArgument`]
/// naming both sizes.
#[inline]
pub(crate) fn whole<T>(status: Status) -> Result<Status> {
    whole_of(size_of::<T>(), std::any::type_name::<T>(), status)
}

/// `status`, when its length is a whole number of `unit`-byte elements (of type `name`).
#[inline]
pub(crate) fn whole_of(unit: usize, name: &str, status: Status) -> Result<Status> {
    // `unit` is a constant for `whole`, so bytes (`unit` 1) check nothing at run time.
    let whole = match unit {
        1 => true,
        0 => status.len == 0,
        _ => status.len % unit == 0,
    };
    if !whole {
        return Err(not_whole(unit, name, status));
    }
    Ok(status)
}

#[cold]
fn not_whole(unit: usize, name: &str, status: Status) -> Error {
    Error::InvalidArgument(format!(
        "a {}-byte message from rank {} (tag {}) is not a whole number of {unit}-byte elements ({name})",
        status.len, status.source, status.tag
    ))
}

/// What an [`Owned`] buffer's element type was: enough to free it and to say its size.
pub(crate) struct Element {
    /// `size_of` the element type.
    size: usize,
    /// Frees a buffer as the `Vec` of that type it was (pointer, length, capacity).
    free: unsafe fn(NonNull<u8>, usize, usize),
}

/// Frees `(ptr, len, cap)`, the parts of a `Vec<T>`.
///
/// # Safety
/// They are the parts of a `Vec<T>` that nothing else owns.
unsafe fn free<T>(ptr: NonNull<u8>, len: usize, cap: usize) {
    // SAFETY: forwarded to the caller.
    drop(unsafe { Vec::from_raw_parts(ptr.cast::<T>().as_ptr(), len, cap) });
}

/// The buffer of a request, a `Vec<T>` of plain-old-data `T`, taken apart so that the context
/// can hold the buffers of requests of every element type in one table. It frees the vector
/// when dropped; [`Owned::into_vec`] gives it back whole.
pub(crate) struct Owned {
    ptr: NonNull<u8>,
    /// In elements.
    len: usize,
    /// In elements.
    cap: usize,
    element: &'static Element,
}

// SAFETY: an `Owned` is the sole owner of its memory, as the `Vec` it was; its elements are
// plain data (`Pod`: no references, no drop).
unsafe impl Send for Owned {}

impl Owned {
    /// Takes `v` apart.
    #[inline]
    pub(crate) fn new<T: Pod>(v: Vec<T>) -> Owned {
        let mut v = ManuallyDrop::new(v);
        let element = const { &Element { size: size_of::<T>(), free: free::<T> } };
        // A Vec's pointer is never null (dangling, not null, when nothing is allocated).
        let ptr = NonNull::new(v.as_mut_ptr()).expect("a Vec's pointer is not null").cast::<u8>();
        Owned { ptr, len: v.len(), cap: v.capacity(), element }
    }

    /// The vector again.
    ///
    /// # Safety
    /// `T` is the element type it was made from.
    #[inline]
    pub(crate) unsafe fn into_vec<T: Pod>(self) -> Vec<T> {
        debug_assert_eq!(self.element.size, size_of::<T>(), "taken back as another element type");
        let me = ManuallyDrop::new(self);
        // SAFETY: the parts of a `Vec<T>` (the caller's promise), owned by nothing else.
        unsafe { Vec::from_raw_parts(me.ptr.cast::<T>().as_ptr(), me.len, me.cap) }
    }

    /// Bytes it holds allocated.
    pub(crate) fn capacity_bytes(&self) -> usize {
        self.cap * self.element.size
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: the parts of a `Vec` of the type `element` was made for, owned by `self`.
        unsafe { (self.element.free)(self.ptr, self.len, self.cap) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_buffers_come_back_whole_and_free_themselves() {
        let v: Vec<f64> = vec![1.5, -2.0, 3.25];
        let o = Owned::new(v);
        assert_eq!(o.capacity_bytes(), 3 * 8);
        // SAFETY: made from a Vec<f64>.
        assert_eq!(unsafe { o.into_vec::<f64>() }, [1.5, -2.0, 3.25]);
        drop(Owned::new(vec![7u32; 1000]));
        drop(Owned::new(Vec::<u16>::new()));
        // SAFETY: made from a Vec<()>.
        assert_eq!(unsafe { Owned::new(vec![(); 5]).into_vec::<()>() }.len(), 5);
    }

    #[test]
    fn lengths_that_are_not_whole_elements_are_errors_naming_the_sizes() {
        let st = |len| Status { source: 3, tag: 9, len };
        assert!(whole::<u8>(st(13)).is_ok());
        assert!(whole::<f64>(st(16)).is_ok());
        let e = whole::<f64>(st(12)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("12-byte") && m.contains("8-byte")), "{e}");
        assert!(whole::<()>(st(0)).is_ok() && whole::<()>(st(1)).is_err());
        assert_eq!(bytes(&[0x0102u16]), 0x0102u16.to_ne_bytes());
        assert!(bytes(&[(), ()]).is_empty());
    }
}
