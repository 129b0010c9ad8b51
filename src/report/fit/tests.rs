use super::*;

#[test]
fn a_request_that_follows_the_batch_grows_with_it_and_others_do_not() {
    assert_eq!(resize(Scale::Batch, 4096, 8, 32), 16384);
    // As two runs showed it: 1 MiB fixed and 256 KiB a sample, at 3 and 6.
    let measured = Scale::Measured {
        here: (1 << 20) + 3 * (256 << 10),
        there: (1 << 20) + 6 * (256 << 10),
        at: 3,
        other: 6,
    };
    assert_eq!(resize(measured, 0, 3, 12), (1 << 20) + 12 * (256 << 10));
    assert_eq!(resize(measured, 0, 3, 1), (1 << 20) + (256 << 10));
    // Shrinking with the batch stops at nothing.
    let shrinking = Scale::Measured {
        here: 100,
        there: 50,
        at: 1,
        other: 2,
    };
    assert_eq!(resize(shrinking, 100, 1, 5), 0);
    assert_eq!(resize(shrinking, 100, 1, 3), 0);
    assert_eq!(resize(Scale::Batch, 100, 3, 4), 134);
    assert_eq!(resize(Scale::Fixed, 4096, 8, 32), 4096);
    assert_eq!(resize(Scale::Unknown, 4096, 8, 32), 4096);
    // Sizes and batches near 2^64 (a hostile trace, a caller's --batch) saturate, never wrap.
    let steep = Scale::Measured {
        here: 0,
        there: u64::MAX,
        at: 1,
        other: 2,
    };
    assert_eq!(resize(steep, 0, 1, u64::MAX), u64::MAX);
    assert_eq!(resize(Scale::Batch, u64::MAX, 1, u64::MAX), u64::MAX);
    let falling = Scale::Measured {
        here: u64::MAX,
        there: 0,
        at: 1,
        other: 2,
    };
    assert_eq!(resize(falling, 0, 1, u64::MAX), 0);
}

#[test]
fn the_largest_batch_is_found_by_doubling_then_halving() {
    let row = |b: u64| Row {
        batch: b,
        peak_reserved_bytes: b * 10,
        peak_allocated_bytes: 0,
        failures: u64::from(b > 37),
        workspaces_done_without: 0,
    };
    assert_eq!(largest(&row, 1000), (37, 370));
    assert_eq!(largest(&row, 20), (20, 200));
    let none = |b: u64| Row {
        batch: b,
        peak_reserved_bytes: 0,
        peak_allocated_bytes: 0,
        failures: 1,
        workspaces_done_without: 0,
    };
    assert_eq!(largest(&none, 100), (0, 0));
}
