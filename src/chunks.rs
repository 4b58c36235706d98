//! [`Chunks`]: a growable arena stored in chunks of at most [`CHUNK`] items, so that growing
//! it never moves more than one chunk.
//!
//! A `Vec` that grows by a small fraction keeps little spare room but copies every item
//! again and again as it grows; one that doubles copies each item about once but may keep
//! as much spare room as items. Here only the last chunk has spare room, and it doubles up
//! to [`CHUNK`] items: spare room stays below [`CHUNK`] / 2 items, and an item is copied
//! about once, while its chunk fills.
//!
//! Items are addressed by their index, as in a `Vec`: index `i` is item `i % CHUNK` of
//! chunk `i / CHUNK`.

/// Items per full chunk (a power of two).
pub(crate) const CHUNK: usize = 1 << SHIFT;
const SHIFT: u32 = 9;
/// Capacity of a new chunk.
const FIRST: usize = 16;

/// A growable arena of `T` in chunks: see the module docs.
#[derive(Clone, Debug)]
pub(crate) struct Chunks<T> {
    /// Every chunk but the last is full; the last holds at least one item. Chunks past
    /// them are empty, their allocations kept for reuse.
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunks<T> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunks<T> {
    /// Items held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `item` at index [`Self::len`].
    pub(crate) fn push(&mut self, item: T) {
        let c = self.len >> SHIFT;
        if c == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(FIRST));
        }
        let chunk = &mut self.chunks[c];
        if chunk.len() == chunk.capacity() {
            // Double, up to a full chunk.
            chunk.reserve_exact(chunk.len().clamp(1, CHUNK - chunk.len()));
        }
        chunk.push(item);
        self.len += 1;
    }

    /// Removes every item, keeping the allocations.
    pub(crate) fn clear(&mut self) {
        self.chunks.iter_mut().for_each(Vec::clear);
        self.len = 0;
    }

    /// Bytes allocated.
    pub(crate) fn allocation_size(&self) -> usize {
        self.chunks.capacity() * core::mem::size_of::<Vec<T>>()
            + self
                .chunks
                .iter()
                .map(|c| c.capacity() * core::mem::size_of::<T>())
                .sum::<usize>()
    }
}

impl<T> core::ops::Index<usize> for Chunks<T> {
    type Output = T;

    /// # Panics
    ///
    /// When `index` is not below [`Chunks::len`], as a slice's index does.
    #[inline]
    fn index(&self, index: usize) -> &T {
        &self.chunks[index >> SHIFT][index & (CHUNK - 1)]
    }
}

impl<T> core::ops::IndexMut<usize> for Chunks<T> {
    #[inline]
    fn index_mut(&mut self, index: usize) -> &mut T {
        &mut self.chunks[index >> SHIFT][index & (CHUNK - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Push(u32),
        Set(usize, u32),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            40 => any::<u32>().prop_map(Op::Push),
            4 => (any::<usize>(), any::<u32>()).prop_map(|(i, v)| Op::Set(i, v)),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Every operation answers as a `Vec` does, and spare room stays below half a chunk
        /// past the first chunk's growth.
        #[test]
        fn matches_a_vec(ops in proptest::collection::vec(op(), 0..3000)) {
            let mut chunks = Chunks::default();
            let mut model = Vec::new();
            for op in ops {
                match op {
                    Op::Push(v) => {
                        chunks.push(v);
                        model.push(v);
                    }
                    Op::Set(i, v) if !model.is_empty() => {
                        let i = i % model.len();
                        chunks[i] = v;
                        model[i] = v;
                    }
                    Op::Set(..) => prop_assert_eq!(chunks.len(), 0),
                    Op::Clear => {
                        chunks.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(chunks.len(), model.len());
            }
            for (i, v) in model.iter().enumerate() {
                prop_assert_eq!(chunks[i], *v);
            }
        }
    }

    #[test]
    fn spare_room_stays_below_half_a_chunk() {
        let mut chunks = Chunks::default();
        for i in 0..10 * CHUNK + 3 {
            chunks.push(i);
            let items = chunks.len() * core::mem::size_of::<usize>();
            let spare = chunks.allocation_size() - items;
            let table = chunks.chunks.capacity() * core::mem::size_of::<Vec<usize>>();
            assert!(
                spare - table <= (CHUNK / 2).max(FIRST) * core::mem::size_of::<usize>(),
                "{} items: {spare} spare bytes",
                chunks.len()
            );
        }
    }
}
