//! At most a number of items kept of a stream of them, spread evenly over it.

/// At most `max` items kept of a stream of them, spread evenly over it: once `max` are kept,
/// every other one goes, and from then on only every `stride`-th item offered is kept.
#[derive(Clone, Debug)]
pub struct Thinned<T> {
    items: Vec<T>,
    offered: u64,
    stride: u64,
    max: usize,
}

impl<T> Thinned<T> {
    pub fn new(max: usize) -> Thinned<T> {
        Thinned {
            items: Vec::new(),
            offered: 0,
            stride: 1,
            max: max.max(2),
        }
    }

    /// Counts one more item offered; whether it is to be kept (then [`Thinned::push`] it).
    pub fn wants(&mut self) -> bool {
        self.offered += 1;
        (self.offered - 1) % self.stride == 0
    }

    /// Keeps an item [`Thinned::wants`] asked for.
    pub fn push(&mut self, item: T) {
        self.items.push(item);
        if self.items.len() >= self.max {
            let mut i = 0;
            self.items.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride *= 2;
        }
    }

    pub fn items(&self) -> &[T] {
        &self.items
    }

    pub fn into_items(self) -> Vec<T> {
        self.items
    }
}
