//! Intrusive doubly linked lists over arenas, written once for the tree's recency lists and
//! the router's session table.
//!
//! An arena is a slice of items addressed by a typed handle ([`Slot`]); each linked item
//! keeps its `prev` and `next` handles ([`Linked`]), and a [`List`] keeps the head and tail.
//! `Slot::NONE` ends a list.

/// A typed handle into an arena.
pub(crate) trait Slot: Copy + Eq + core::fmt::Debug {
    /// "No item": the end of a list.
    const NONE: Self;
    /// The item's index in its arena.
    fn index(self) -> usize;
}

impl Slot for u32 {
    const NONE: u32 = u32::MAX;
    #[inline]
    fn index(self) -> usize {
        self as usize
    }
}

/// Head and tail of an intrusive doubly linked list over an arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List<I> {
    pub(crate) head: I,
    pub(crate) tail: I,
}

impl<I: Slot> Default for List<I> {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl<I: Slot> List<I> {
    pub(crate) const EMPTY: List<I> = List {
        head: I::NONE,
        tail: I::NONE,
    };

    /// The first item, unless the list is empty.
    #[inline]
    pub(crate) fn first(&self) -> Option<I> {
        (self.head != I::NONE).then_some(self.head)
    }
}

/// Arena items with `prev` / `next` links.
pub(crate) trait Linked<I> {
    fn links(&self) -> (I, I);
    fn set_prev(&mut self, prev: I);
    fn set_next(&mut self, next: I);
}

/// Implements [`Linked`] for an arena item through its two link fields.
macro_rules! linked {
    ($item:ty, $id:ty, $prev:ident, $next:ident) => {
        impl $crate::list::Linked<$id> for $item {
            #[inline]
            fn links(&self) -> ($id, $id) {
                (self.$prev, self.$next)
            }
            #[inline]
            fn set_prev(&mut self, prev: $id) {
                self.$prev = prev;
            }
            #[inline]
            fn set_next(&mut self, next: $id) {
                self.$next = next;
            }
        }
    };
}
pub(crate) use linked;

/// Whether `i` is in `list` (its links say so, or it is the head).
#[inline]
pub(crate) fn is_linked<I: Slot, T: Linked<I>>(items: &[T], list: &List<I>, i: I) -> bool {
    items[i.index()].links().0 != I::NONE || list.head == i
}

/// Takes `i` out of `list`.
pub(crate) fn unlink<I: Slot, T: Linked<I>>(items: &mut [T], list: &mut List<I>, i: I) {
    let (prev, next) = items[i.index()].links();
    if prev == I::NONE {
        list.head = next;
    } else {
        items[prev.index()].set_next(next);
    }
    if next == I::NONE {
        list.tail = prev;
    } else {
        items[next.index()].set_prev(prev);
    }
    items[i.index()].set_prev(I::NONE);
    items[i.index()].set_next(I::NONE);
}

/// Links `i` just before `before`, or at the tail when `before` is `NONE`.
pub(crate) fn link_before<I: Slot, T: Linked<I>>(
    items: &mut [T],
    list: &mut List<I>,
    i: I,
    before: I,
) {
    let prev = if before == I::NONE {
        list.tail
    } else {
        items[before.index()].links().0
    };
    items[i.index()].set_prev(prev);
    items[i.index()].set_next(before);
    if prev == I::NONE {
        list.head = i;
    } else {
        items[prev.index()].set_next(i);
    }
    if before == I::NONE {
        list.tail = i;
    } else {
        items[before.index()].set_prev(i);
    }
}

/// Links `i` just after `after` (which is linked).
pub(crate) fn link_after<I: Slot, T: Linked<I>>(
    items: &mut [T],
    list: &mut List<I>,
    i: I,
    after: I,
) {
    let next = items[after.index()].links().1;
    link_before(items, list, i, next);
}

/// Checks a list: back links, tail, `valid` for every item, and order by `key`
/// (non-decreasing from head to tail). Returns the number of items.
pub(crate) fn check<I: Slot, T: Linked<I>, K: Ord>(
    items: &[T],
    list: &List<I>,
    valid: impl Fn(I) -> bool,
    key: impl Fn(I) -> K,
) -> Result<usize, String> {
    let mut count = 0;
    let mut prev = I::NONE;
    let mut i = list.head;
    while i != I::NONE {
        if count > items.len() || !valid(i) || items[i.index()].links().0 != prev {
            return Err(format!("bad item or link at {i:?}"));
        }
        if prev != I::NONE && key(prev) > key(i) {
            return Err(format!("out of order at {i:?}"));
        }
        count += 1;
        prev = i;
        i = items[i.index()].links().1;
    }
    if prev != list.tail {
        return Err("wrong tail".into());
    }
    Ok(count)
}
