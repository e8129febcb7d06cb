//! The bump arena behind the component allocator ([`crate::heap`]), as
//! offsets into a segment of fixed size, so that its rules are tested
//! natively: blocks are handed out in order; only the most recent one can
//! be freed (which gives it back) or resized in place; and what has never
//! been handed out is known to be still zero.

use core::alloc::Layout;
use core::cell::Cell;

pub(crate) struct Arena<const CAPACITY: usize> {
    /// Where the next block may start.
    next: Cell<usize>,
    /// One past where the most recent block starts (0: none yet), so that a
    /// new arena is all zeros.
    last: Cell<usize>,
    /// Everything from here on has never been handed out.
    untouched: Cell<usize>,
}

impl<const CAPACITY: usize> Arena<CAPACITY> {
    pub(crate) const fn new() -> Self {
        Arena {
            next: Cell::new(0),
            last: Cell::new(0),
            untouched: Cell::new(0),
        }
    }

    /// The offset of a new block of `layout`, aligned as it asks for in a
    /// segment that starts at address `base`, and whether the block may hold
    /// anything but the segment's initial zeros; `None` once it does not fit.
    pub(crate) fn alloc(&self, base: usize, layout: Layout) -> Option<(usize, bool)> {
        // Two empty blocks at one offset would make freeing one give back the other.
        debug_assert!(layout.size() != 0, "GlobalAlloc is never asked for zero bytes");
        let start = base.checked_add(self.next.get())?.checked_next_multiple_of(layout.align())? - base;
        let end = start.checked_add(layout.size()).filter(|&e| e <= CAPACITY)?;
        self.next.set(end);
        self.last.set(start + 1);
        let dirty = start < self.untouched.get();
        self.untouched.set(self.untouched.get().max(end));
        Some((start, dirty))
    }

    /// Gives back the block at `offset` if it is the most recent one.
    pub(crate) fn free(&self, offset: usize) {
        if offset + 1 == self.last.get() {
            self.next.set(offset);
        }
    }

    /// Grows or shrinks the block at `offset` in place, if it is the most
    /// recent one and the segment can hold its new size.
    pub(crate) fn resize_in_place(&self, offset: usize, new_size: usize) -> bool {
        if offset + 1 != self.last.get() {
            return false;
        }
        match offset.checked_add(new_size).filter(|&e| e <= CAPACITY) {
            Some(end) => {
                self.next.set(end);
                self.untouched.set(self.untouched.get().max(end));
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn a_new_arena_is_all_zeros() {
        // What keeps the allocator's state out of the component's initial
        // data (crate::heap): a static that is all zeros is not part of it.
        let words: [usize; 3] = unsafe { core::mem::transmute(Arena::<64>::new()) };
        assert_eq!(words, [0; 3]);
    }

    #[test]
    fn blocks_are_aligned_in_order_and_never_overlap() {
        let a = Arena::<1024>::new();
        // A base that is not itself aligned: alignment is of the address.
        let base = 0x1004;
        let (x, _) = a.alloc(base, layout(3, 1)).unwrap();
        let (y, _) = a.alloc(base, layout(8, 8)).unwrap();
        let (z, _) = a.alloc(base, layout(1, 16)).unwrap();
        assert_eq!(x, 0);
        assert!(y >= 3 && (base + y) % 8 == 0, "{y}");
        assert!(z >= y + 8 && (base + z) % 16 == 0, "{z}");
    }

    #[test]
    fn a_full_arena_says_so_and_stays_usable_for_what_fits() {
        let a = Arena::<64>::new();
        assert!(a.alloc(0, layout(65, 1)).is_none());
        assert_eq!(a.alloc(0, layout(60, 1)), Some((0, false)));
        assert!(a.alloc(0, layout(8, 1)).is_none());
        assert_eq!(a.alloc(0, layout(4, 1)), Some((60, false)));
        assert!(
            a.alloc(usize::MAX - 2, layout(1, 8)).is_none(),
            "an address overflow is a refusal, not a panic"
        );
    }

    #[test]
    fn only_the_most_recent_block_is_given_back_and_then_is_dirty() {
        let a = Arena::<1024>::new();
        let (x, _) = a.alloc(0, layout(16, 8)).unwrap();
        let (y, _) = a.alloc(0, layout(16, 8)).unwrap();
        a.free(x); // not the most recent: kept
        let (z, dirty) = a.alloc(0, layout(16, 8)).unwrap();
        assert_eq!((z, dirty), (32, false));
        a.free(z); // the most recent: given back
        let (w, dirty) = a.alloc(0, layout(24, 8)).unwrap();
        assert_eq!(w, z);
        assert!(dirty, "a block that reuses given-back space may hold old bytes");
        assert!(w >= y + 16);
    }

    #[test]
    fn a_given_back_block_is_reused_with_a_larger_alignment() {
        let a = Arena::<1024>::new();
        let (x, _) = a.alloc(0, layout(3, 1)).unwrap();
        let (y, _) = a.alloc(0, layout(5, 1)).unwrap();
        a.free(y);
        let (z, dirty) = a.alloc(0, layout(8, 64)).unwrap();
        assert_eq!((x, y, z), (0, 3, 64));
        assert!(!dirty, "only bytes 3..8 were handed out before");
    }

    #[test]
    fn the_most_recent_block_grows_and_shrinks_in_place() {
        let a = Arena::<100>::new();
        let (x, _) = a.alloc(0, layout(10, 1)).unwrap();
        let (y, _) = a.alloc(0, layout(10, 1)).unwrap();
        assert!(!a.resize_in_place(x, 20), "an earlier block cannot grow in place");
        assert!(a.resize_in_place(y, 50));
        assert!(!a.resize_in_place(y, 91), "past the end");
        assert!(a.resize_in_place(y, 5));
        let (z, dirty) = a.alloc(0, layout(10, 1)).unwrap();
        assert_eq!(z, y + 5);
        assert!(dirty, "the shrunk block's old tail was handed out");
        let (_, dirty) = a.alloc(0, layout(40, 1)).unwrap();
        assert!(dirty, "it starts below the grown block's end");
        let (w, dirty) = a.alloc(0, layout(10, 1)).unwrap();
        assert_eq!(w, 65);
        assert!(!dirty, "past the high-water mark: still zero");
    }
}
