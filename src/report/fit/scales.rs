//! How each of the run's requests scales, four bytes a request. A long run's trace holds tens
//! of millions of requests, nearly all of them following the batch or fixed; a [`Scale`] is 40
//! bytes (a reduction's or a second run's figures), and a vector of them took 440 MB of the
//! kinds program's 1.88 GB trace's `fit`. Here the plain scales are a number each, and the few
//! with figures (a global reduction's staging buffer, a request a second run measured) are
//! kept apart, each request holding its entry's place.

use super::Scale;

/// The plain scales' numbers; a number from `RARE` on is `RARE` plus an entry's place.
const BATCH: u32 = 0;
const FIXED: u32 = 1;
const UNKNOWN: u32 = 2;
const SEMAPHORE: u32 = 3;
const RARE: u32 = 4;

/// Each request's [`Scale`], by its place among the requests.
#[derive(Debug)]
pub(super) struct Scales {
    packed: Vec<u32>,
    /// The scales with figures, each one request's.
    rare: Vec<Scale>,
}

impl Scales {
    pub(super) fn len(&self) -> usize {
        self.packed.len()
    }

    /// The `n`-th request's scale (`None` past the last).
    pub(super) fn get(&self, n: usize) -> Option<Scale> {
        let p = *self.packed.get(n)?;
        Some(match p {
            BATCH => Scale::Batch,
            FIXED => Scale::Fixed,
            UNKNOWN => Scale::Unknown,
            SEMAPHORE => Scale::Semaphore,
            rare => self
                .rare
                .get((rare - RARE) as usize)
                .copied()
                .unwrap_or(Scale::Unknown),
        })
    }

    /// Sets the `n`-th request's scale (nothing past the last). A request's entry with figures
    /// is its own, so a second one takes its place.
    pub(super) fn set(&mut self, n: usize, s: Scale) {
        let Some(&old) = self.packed.get(n) else {
            return;
        };
        let p = match (plain(s), old.checked_sub(RARE)) {
            (Some(p), _) => p,
            (None, Some(at)) => {
                if let Some(e) = self.rare.get_mut(at as usize) {
                    *e = s;
                }
                old
            }
            (None, None) => self.push_rare(s),
        };
        if let Some(slot) = self.packed.get_mut(n) {
            *slot = p;
        }
    }

    /// Each request's scale, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Scale> + '_ {
        (0..self.len()).filter_map(|n| self.get(n))
    }

    /// A new entry with figures: its number. Past `u32`'s numbers (four billion requests, far
    /// more than memory holds of a trace), the request keeps its recorded size.
    fn push_rare(&mut self, s: Scale) -> u32 {
        match u32::try_from(self.rare.len())
            .ok()
            .and_then(|i| i.checked_add(RARE))
        {
            Some(p) => {
                self.rare.push(s);
                p
            }
            None => UNKNOWN,
        }
    }
}

/// A plain scale's number (`None`: one with figures).
fn plain(s: Scale) -> Option<u32> {
    match s {
        Scale::Batch => Some(BATCH),
        Scale::Fixed => Some(FIXED),
        Scale::Unknown => Some(UNKNOWN),
        Scale::Semaphore => Some(SEMAPHORE),
        Scale::Reduction(_) | Scale::Latent(_) | Scale::Measured { .. } => None,
    }
}

impl FromIterator<Scale> for Scales {
    fn from_iter<I: IntoIterator<Item = Scale>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut scales = Scales {
            packed: Vec::with_capacity(iter.size_hint().0),
            rare: Vec::new(),
        };
        for s in iter {
            let p = match plain(s) {
                Some(p) => p,
                None => scales.push_rare(s),
            };
            scales.packed.push(p);
        }
        scales
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_scale() -> impl Strategy<Value = Scale> {
        prop_oneof![
            Just(Scale::Batch),
            Just(Scale::Fixed),
            Just(Scale::Unknown),
            Just(Scale::Semaphore),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
                |(here, there, at, other)| Scale::Measured {
                    here,
                    there,
                    at,
                    other
                }
            ),
        ]
    }

    proptest! {
        /// Whatever is put in, and however it is set after, each request reads back as the
        /// vector of scales it stands for would say, and entries with figures are not
        /// multiplied by setting them again.
        #[test]
        fn scales_read_back_as_a_vector_of_them_would(
            first in proptest::collection::vec(any_scale(), 0..64),
            sets in proptest::collection::vec((any::<usize>(), any_scale()), 0..64),
        ) {
            let figures = |s: &Scale| plain(*s).is_none();
            let most_entries =
                first.iter().filter(|s| figures(s)).count() + sets.iter().filter(|(_, s)| figures(s)).count();
            let mut want = first.clone();
            let mut got: Scales = first.into_iter().collect();
            for (n, s) in sets {
                let n = if want.is_empty() { n } else { n % (want.len() + 1) };
                if let Some(w) = want.get_mut(n) {
                    *w = s;
                }
                got.set(n, s);
            }
            prop_assert_eq!(got.len(), want.len());
            prop_assert_eq!(got.iter().collect::<Vec<_>>(), want.clone());
            prop_assert_eq!(got.get(want.len()), None);
            prop_assert!(got.rare.len() <= most_entries);
        }
    }

    #[test]
    fn a_request_measured_again_keeps_its_one_entry() {
        let m = |there| Scale::Measured {
            here: 1,
            there,
            at: 1,
            other: 2,
        };
        let mut v: Scales = [Scale::Batch, m(5)].into_iter().collect();
        v.set(1, m(7));
        v.set(0, m(9));
        v.set(0, m(11));
        assert_eq!(v.rare.len(), 2);
        assert_eq!(v.iter().collect::<Vec<_>>(), vec![m(11), m(7)]);
    }

    #[test]
    fn a_plain_scale_takes_four_bytes() {
        let v: Scales = std::iter::repeat_n(Scale::Batch, 1000).collect();
        assert_eq!(v.packed.len() * std::mem::size_of::<u32>(), 4000);
        assert!(v.rare.is_empty());
        assert!(
            std::mem::size_of::<Scale>() >= 32,
            "a scale with figures is larger"
        );
    }
}
