//! The plugin's allocator inside a component: dlmalloc, as Rust's standard
//! allocator for `wasm32-unknown-unknown` is, but with a first segment of
//! [`STATIC_HEAP_BYTES`] that is part of the plugin's initial memory.
//!
//! Why: the engine starts every call in a fresh instance, so the standard
//! allocator's first allocation of every call is a `memory.grow`. When the
//! host protects memory with guard pages, each grow is an `mprotect` of the
//! new pages, and resetting the instance for the next call is another; on a
//! multi-threaded host both cost far more than the plugin's own work for a
//! small assertion. With a static first segment, a call that allocates less
//! than that never grows memory, and a call that needs more still grows as
//! before.
//!
//! Enabled by the `allocator` feature (on by default). A plugin that brings
//! its own `#[global_allocator]` turns the feature off.

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32;
use core::cell::{Cell, UnsafeCell};
use core::ptr;

/// The first segment's size: a trace of a few hundred kilobytes, its
/// decoded form and a batch of configs fit, so most calls never grow memory.
/// It is zero-initialised data, so it adds nothing to the component's size.
pub const STATIC_HEAP_BYTES: usize = 1 << 20;

const WASM_PAGE: usize = 64 * 1024;

#[repr(C, align(16))]
struct StaticHeap(UnsafeCell<[u8; STATIC_HEAP_BYTES]>);

// A component instance is single-threaded (no `atomics` target feature).
unsafe impl Sync for StaticHeap {}

static STATIC_HEAP: StaticHeap = StaticHeap(UnsafeCell::new([0; STATIC_HEAP_BYTES]));

/// Where dlmalloc takes its segments: the static heap once, then
/// `memory.grow`.
struct Segments {
    static_heap_given: Cell<bool>,
}

unsafe impl dlmalloc::Allocator for Segments {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        if !self.static_heap_given.get() && size <= STATIC_HEAP_BYTES {
            self.static_heap_given.set(true);
            return (STATIC_HEAP.0.get().cast::<u8>(), STATIC_HEAP_BYTES, 0);
        }
        let pages = size.div_ceil(WASM_PAGE);
        let previous = wasm32::memory_grow(0, pages);
        if previous == usize::MAX {
            return (ptr::null_mut(), 0, 0);
        }
        let base = previous * WASM_PAGE;
        let bytes = pages * WASM_PAGE;
        // A region that ends at the top of the 4 GiB address space would make
        // one-past-the-end pointers wrap to 0; keep its last bytes back.
        if base.wrapping_add(bytes) == 0 {
            return (base as *mut u8, bytes - 16, 0);
        }
        (base as *mut u8, bytes, 0)
    }

    fn remap(&self, _: *mut u8, _: usize, _: usize, _: bool) -> *mut u8 {
        ptr::null_mut()
    }

    fn free_part(&self, _: *mut u8, _: usize, _: usize) -> bool {
        false
    }

    fn free(&self, _: *mut u8, _: usize) -> bool {
        false
    }

    fn can_release_part(&self, _: u32) -> bool {
        false
    }

    fn allocates_zeros(&self) -> bool {
        // Both the static heap and grown pages start zeroed in a fresh
        // instance, and dlmalloc takes each segment only once.
        true
    }

    fn page_size(&self) -> usize {
        WASM_PAGE
    }
}

struct Heap(UnsafeCell<dlmalloc::Dlmalloc<Segments>>);

// Single-threaded, as above.
unsafe impl Sync for Heap {}

#[global_allocator]
static HEAP: Heap = Heap(UnsafeCell::new(dlmalloc::Dlmalloc::new_with_allocator(Segments {
    static_heap_given: Cell::new(false),
})));

unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        (*self.0.get()).malloc(layout.size(), layout.align())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        (*self.0.get()).calloc(layout.size(), layout.align())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        (*self.0.get()).free(ptr, layout.size(), layout.align())
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        (*self.0.get()).realloc(ptr, layout.size(), layout.align(), new_size)
    }
}
