//! The plugin's allocator inside a component: a bump arena over a static
//! segment of [`STATIC_HEAP_BYTES`] that is part of the plugin's initial
//! memory, then dlmalloc (as Rust's standard allocator for
//! `wasm32-unknown-unknown` is) once the arena is full.
//!
//! Why a static segment: the engine starts every call in a fresh instance,
//! so the standard allocator's first allocation of every call is a
//! `memory.grow`. When the host protects memory with guard pages, each grow
//! is an `mprotect` of the new pages, and resetting the instance for the
//! next call is another; on a multi-threaded host both cost far more than
//! the plugin's own work for a small assertion. A call that allocates less
//! than the segment never grows memory.
//!
//! Why a bump arena in it: an instance lives for one call, so most of what a
//! call allocates lives until the call ends. Allocating is then moving a
//! pointer, freeing the most recent block gives it back, growing the most
//! recent block (a `String` being written, a `Vec` being filled) happens in
//! place, and so does shrinking any block. Other frees give nothing back, so
//! at most the segment is spent on blocks that are no longer used; after
//! that, dlmalloc serves every allocation from grown memory and reuses what
//! is freed, so a plugin that allocates and frees in a loop is bounded as it
//! was before.
//!
//! Enabled by the `allocator` feature (on by default). A plugin that brings
//! its own `#[global_allocator]` turns the feature off.

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32;
use core::cell::UnsafeCell;
use core::ptr;

use crate::arena::Arena;

/// The static segment's size: a trace of tens of kilobytes, its decoded
/// form and a batch of configs fit, so most calls never grow memory. It is
/// zero-initialised data, so it adds nothing to the component's size; but
/// it is part of the memory the engine's reset walks after every call, page
/// by page, so a larger segment would make every call slower to spare a
/// `memory.grow` only to calls on traces large enough that decoding them
/// costs far more (docs/benchmarks.md, "A smaller memory to reset").
pub const STATIC_HEAP_BYTES: usize = 256 * 1024;

const WASM_PAGE: usize = 64 * 1024;

/// The arena's bookkeeping and the segment it hands out, all zeros at
/// the start, so that the linker places them in zero-initialised memory
/// after the data the component starts with, and on pages of their own.
/// Each call writes to them; when the engine resets the instance, a page
/// it wrote that also holds initial data is copied back from the
/// component's image, while a page of zeros is only cleared, which is
/// cheaper (docs/benchmarks.md, "pages a call writes").
#[repr(C, align(4096))]
struct StaticHeap {
    arena: Arena<STATIC_HEAP_BYTES>,
    bytes: UnsafeCell<[u8; STATIC_HEAP_BYTES]>,
}

// A component instance is single-threaded (no `atomics` target feature).
#[cfg(target_feature = "atomics")]
compile_error!("the SDK's allocator assumes a single-threaded component: build without `atomics`, or turn off the `allocator` feature");
unsafe impl Sync for StaticHeap {}

static STATIC_HEAP: StaticHeap = StaticHeap {
    arena: Arena::new(),
    bytes: UnsafeCell::new([0; STATIC_HEAP_BYTES]),
};

/// Where dlmalloc takes its segments: `memory.grow`, once the arena is full.
struct Grown;

unsafe impl dlmalloc::Allocator for Grown {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
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
        // Grown pages start zeroed, and dlmalloc takes each segment only once.
        true
    }

    fn page_size(&self) -> usize {
        WASM_PAGE
    }
}

fn base() -> usize {
    STATIC_HEAP.bytes.get() as usize
}

/// The offset of `block` in the static segment, if it is in it.
fn offset_of(block: *mut u8) -> Option<usize> {
    (block as usize).checked_sub(base()).filter(|&o| o < STATIC_HEAP_BYTES)
}

struct Heap {
    grown: UnsafeCell<dlmalloc::Dlmalloc<Grown>>,
}

// Single-threaded, as above.
unsafe impl Sync for Heap {}

#[global_allocator]
static HEAP: Heap = Heap {
    grown: UnsafeCell::new(dlmalloc::Dlmalloc::new_with_allocator(Grown)),
};

unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match STATIC_HEAP.arena.alloc(base(), layout) {
            Some((offset, _)) => (base() + offset) as *mut u8,
            None => (*self.grown.get()).malloc(layout.size(), layout.align()),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match STATIC_HEAP.arena.alloc(base(), layout) {
            Some((offset, dirty)) => {
                let block = (base() + offset) as *mut u8;
                if dirty {
                    ptr::write_bytes(block, 0, layout.size());
                }
                block
            }
            None => (*self.grown.get()).calloc(layout.size(), layout.align()),
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match offset_of(block) {
            Some(offset) => STATIC_HEAP.arena.free(offset),
            None => (*self.grown.get()).free(block, layout.size(), layout.align()),
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match offset_of(block) {
            Some(offset) => {
                // The most recent block resizes in place; any other block
                // shrinks in place (the arena's frees ignore sizes), so a
                // shrink never needs memory that may not be there.
                if STATIC_HEAP.arena.resize_in_place(offset, new_size) || new_size <= layout.size() {
                    return block;
                }
                let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                let moved = self.alloc(new_layout);
                if !moved.is_null() {
                    ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    STATIC_HEAP.arena.free(offset);
                }
                moved
            }
            None => (*self.grown.get()).realloc(block, layout.size(), layout.align(), new_size),
        }
    }
}
