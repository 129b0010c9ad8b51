//! A map by device ordinal (a trace names devices 0 to 254): a place a device, found by one
//! index where an ordered map searched its tree. The picture's trackers look up a device's lane
//! at every allocation and free (two to four times), a twentieth of the picture's first pass.
//! Iterated in the order of the devices, as an ordered map is; it holds as many places as the
//! highest device it was given, 256 at most.

/// Values by device ordinal.
#[derive(Clone, Debug)]
pub struct ByDevice<V> {
    places: Vec<Option<V>>,
}

impl<V> Default for ByDevice<V> {
    fn default() -> Self {
        ByDevice { places: Vec::new() }
    }
}

impl<V> ByDevice<V> {
    #[inline]
    pub fn get(&self, device: u8) -> Option<&V> {
        self.places.get(usize::from(device))?.as_ref()
    }

    #[inline]
    pub fn get_mut(&mut self, device: u8) -> Option<&mut V> {
        self.places.get_mut(usize::from(device))?.as_mut()
    }

    /// The value of `device`, made by `make` if it has none.
    #[inline]
    pub fn get_or_insert_with(&mut self, device: u8, make: impl FnOnce() -> V) -> &mut V {
        let i = usize::from(device);
        if self.places.len() <= i {
            self.places.resize_with(i + 1, || None);
        }
        self.places[i].get_or_insert_with(make)
    }

    /// `device`'s value set; what it was.
    pub fn insert(&mut self, device: u8, value: V) -> Option<V> {
        let i = usize::from(device);
        if self.places.len() <= i {
            self.places.resize_with(i + 1, || None);
        }
        self.places[i].replace(value)
    }

    /// `device`'s value taken out.
    pub fn remove(&mut self, device: u8) -> Option<V> {
        self.places.get_mut(usize::from(device))?.take()
    }

    /// Each device's value, in the order of the devices.
    pub fn iter(&self) -> impl Iterator<Item = (u8, &V)> {
        (self.places.iter().enumerate()).filter_map(|(d, v)| Some((d as u8, v.as_ref()?)))
    }

    /// Each device's value, in the order of the devices, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u8, &mut V)> {
        (self.places.iter_mut().enumerate()).filter_map(|(d, v)| Some((d as u8, v.as_mut()?)))
    }

    /// Only the devices whose value `keep` keeps.
    pub fn retain(&mut self, mut keep: impl FnMut(u8, &mut V) -> bool) {
        for (d, place) in self.places.iter_mut().enumerate() {
            if let Some(v) = place
                && !keep(d as u8, v)
            {
                *place = None;
            }
        }
    }
}

impl<V: Default> ByDevice<V> {
    /// The value of `device`, a default one made if it has none.
    #[inline]
    pub fn or_default(&mut self, device: u8) -> &mut V {
        self.get_or_insert_with(device, V::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_kept_apart_and_iterated_in_order_as_an_ordered_map_would() {
        let mut m: ByDevice<u64> = ByDevice::default();
        let mut o = std::collections::BTreeMap::new();
        for (d, v) in [(3u8, 30u64), (0, 1), (254, 7), (3, 31), (255, 9)] {
            *m.or_default(d) += v;
            *o.entry(d).or_default() += v;
        }
        assert_eq!(m.get(3), Some(&61));
        assert_eq!(m.get(1), None);
        assert_eq!(m.get(200), None);
        let seen: Vec<(u8, u64)> = m.iter().map(|(d, &v)| (d, v)).collect();
        let want: Vec<(u8, u64)> = o.iter().map(|(&d, &v)| (d, v)).collect();
        assert_eq!(seen, want);
        assert_eq!(m.iter().count(), 4);
        for (_, v) in m.iter_mut() {
            *v += 1;
        }
        m.retain(|d, v| d != 0 && *v > 8);
        assert_eq!(m.iter().map(|(d, _)| d).collect::<Vec<_>>(), vec![3, 255]);
        assert_eq!(m.remove(255), Some(10));
        assert_eq!(m.remove(255), None);
        assert_eq!(m.get_mut(3).map(|v| *v), Some(62));
        assert_eq!(m.insert(3, 5), Some(62));
        assert_eq!(m.insert(9, 1), None);
        assert_eq!(m.remove(9), Some(1));
        m.remove(3);
        assert!(m.iter().next().is_none());
    }
}
