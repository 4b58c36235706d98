//! Intrusive doubly linked lists over arenas of `u32`-addressed items, written once for the
//! tree's LRU lists and the router's session table.

/// "No item" in the arena's `u32` links.
pub(crate) const NIL: u32 = u32::MAX;

/// Head and tail of an intrusive doubly linked list over an arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List {
    pub(crate) head: u32,
    pub(crate) tail: u32,
}

impl Default for List {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl List {
    pub(crate) const EMPTY: List = List {
        head: NIL,
        tail: NIL,
    };
}

/// Arena items with `prev` / `next` links, so the list code is written once for the global
/// node list and the per-worker holding lists.
pub(crate) trait Linked {
    fn links(&self) -> (u32, u32);
    fn set_prev(&mut self, prev: u32);
    fn set_next(&mut self, next: u32);
}

/// Implements [`Linked`] for an arena item through its two link fields.
macro_rules! linked {
    ($item:ty, $prev:ident, $next:ident) => {
        impl $crate::list::Linked for $item {
            fn links(&self) -> (u32, u32) {
                (self.$prev, self.$next)
            }
            fn set_prev(&mut self, prev: u32) {
                self.$prev = prev;
            }
            fn set_next(&mut self, next: u32) {
                self.$next = next;
            }
        }
    };
}
pub(crate) use linked;

pub(crate) fn unlink<T: Linked>(items: &mut [T], list: &mut List, i: u32) {
    let (prev, next) = items[i as usize].links();
    if prev == NIL {
        list.head = next;
    } else {
        items[prev as usize].set_next(next);
    }
    if next == NIL {
        list.tail = prev;
    } else {
        items[next as usize].set_prev(prev);
    }
    items[i as usize].set_prev(NIL);
    items[i as usize].set_next(NIL);
}

/// Links `i` just before `before`, or at the tail when `before` is `NIL`.
pub(crate) fn link_before<T: Linked>(items: &mut [T], list: &mut List, i: u32, before: u32) {
    let prev = if before == NIL {
        list.tail
    } else {
        items[before as usize].links().0
    };
    items[i as usize].set_prev(prev);
    items[i as usize].set_next(before);
    if prev == NIL {
        list.head = i;
    } else {
        items[prev as usize].set_next(i);
    }
    if before == NIL {
        list.tail = i;
    } else {
        items[before as usize].set_prev(i);
    }
}

/// Links `i` just after `after` (which is linked).
pub(crate) fn link_after<T: Linked>(items: &mut [T], list: &mut List, i: u32, after: u32) {
    let next = items[after as usize].links().1;
    link_before(items, list, i, next);
}
