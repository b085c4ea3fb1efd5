//! The process's allocator: mimalloc, asked for a block by its plain entry points whenever the
//! alignment asked for is one every mimalloc block of that size already has, and by its aligned
//! entry points otherwise. (The `mimalloc` crate's allocator uses the aligned ones for every
//! block; mimalloc 3 serves those, for any block over 1 KiB whose size class is not a power of
//! two, by over-allocating, and frees such blocks on a slower path: docs/cost-per-decision.md, "The
//! allocator's aligned path".)
#![allow(
    unsafe_code,
    reason = "a global allocator is an unsafe trait; each block below only forwards to mimalloc"
)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// The alignment every mimalloc block of at least this many bytes has (`MI_MAX_ALIGN_SIZE`), as
/// the standard library's `System` allocator relies on `malloc`'s.
const PLAIN_ALIGN: usize = 16;

/// mimalloc, by its plain entry points where they suffice.
pub struct Mimalloc;

/// Whether a block of `size` bytes from mimalloc's plain entry points is aligned to `align`.
fn plain_suffices(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every method forwards to mimalloc, which returns blocks of at least the size asked for,
// aligned as asked (the plain entry points only where `plain_suffices`), or null; `mi_free`,
// `mi_realloc` and `mi_realloc_aligned` take any block either kind of entry point returned.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation functions take any size and power-of-two alignment.
        unsafe {
            if plain_suffices(layout.size(), layout.align()) {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if plain_suffices(layout.size(), layout.align()) {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the caller passes a block this allocator returned.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller passes a block this allocator returned, with its layout.
        unsafe {
            if plain_suffices(new_size, layout.align()) {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block is aligned as asked, whichever entry point served it (many of one size held
    /// at once, so not only a page's first block is looked at), through growth and shrinking,
    /// and a zeroed one reads zero.
    #[test]
    fn blocks_are_aligned_as_asked_and_zeroed_ones_read_zero() {
        let sizes = (1..=64).chain([100, 1000, 1500, 3000, 4096, 5000, 70_000]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                let grown = Layout::from_size_align(size * 3, align).unwrap();
                // SAFETY: non-zero sizes; each block is freed once, with the layout it has then.
                unsafe {
                    let held: Vec<*mut u8> = (0..64)
                        .map(|_| {
                            let p = Mimalloc.alloc_zeroed(layout);
                            assert!(!p.is_null());
                            assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                            assert!((0..size).all(|i| *p.add(i) == 0), "size {size} zeroed");
                            let q = Mimalloc.realloc(p, layout, grown.size());
                            assert_eq!(q as usize % align, 0, "grown: {size}, align {align}");
                            let r = Mimalloc.realloc(q, grown, size);
                            assert_eq!(r as usize % align, 0, "shrunk: {size}, align {align}");
                            let s = Mimalloc.alloc(layout);
                            assert_eq!(s as usize % align, 0, "size {size}, align {align}");
                            Mimalloc.dealloc(s, layout);
                            r
                        })
                        .collect();
                    for p in held {
                        Mimalloc.dealloc(p, layout);
                    }
                }
            }
        }
    }
}
