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
    assert_eq!(largest(&row, 1000, 1), (37, 370));
    assert_eq!(largest(&row, 20, 1), (20, 200));
    let none = |b: u64| Row {
        batch: b,
        peak_reserved_bytes: 0,
        peak_allocated_bytes: 0,
        failures: 1,
        workspaces_done_without: 0,
    };
    assert_eq!(largest(&none, 100, 1), (0, 0));
}

#[test]
fn the_search_replaying_side_by_side_answers_what_one_replay_at_a_time_answers() {
    // Whatever the threads, the answer is the one-at-a-time search's, and every batch that
    // search replays is replayed: also where failures do not rise with the batch (a quirk of
    // the allocator's cache), which a search that trusted that would answer otherwise.
    let asked = std::sync::Mutex::new(Vec::new());
    let search = |fails: &(dyn Fn(u64) -> bool + Sync), max: u64, threads: usize| {
        asked.lock().unwrap().clear();
        let row = |b: u64| {
            asked.lock().unwrap().push(b);
            Row {
                batch: b,
                peak_reserved_bytes: b * 10,
                peak_allocated_bytes: 0,
                failures: u64::from(fails(b)),
                workspaces_done_without: 0,
            }
        };
        let answer = largest(&row, max, threads);
        let mut batches = asked.lock().unwrap().clone();
        batches.sort_unstable();
        batches.dedup();
        (answer, batches)
    };
    for limit in [0u64, 1, 2, 3, 5, 37, 64, 65, 127, 500, 999, 1000] {
        let rising = move |b: u64| b > limit;
        // Fails at the limit and past it, and also at 11 and 12 below it.
        let quirky = move |b: u64| b > limit || (limit > 12 && (b == 11 || b == 12));
        for fails in [&rising as &(dyn Fn(u64) -> bool + Sync), &quirky] {
            for max in [1u64, 20, 1000] {
                let (one, one_asked) = search(fails, max, 1);
                for threads in [2, 3, 7, 16] {
                    let (many, many_asked) = search(fails, max, threads);
                    assert_eq!(many, one, "limit {limit}, max {max}, {threads} threads");
                    assert!(
                        one_asked.iter().all(|b| many_asked.contains(b)),
                        "limit {limit}, max {max}, {threads} threads: {one_asked:?} not in \
                         {many_asked:?}"
                    );
                }
            }
        }
    }
}

static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note(line: &str) {
    if let Ok(mut said) = SAID.lock() {
        said.push(line.to_string());
    }
}

/// Where progress is shown, `fit` says before each replay which setting and batch it replays
/// and how many replays are done: every row asked for under both settings, then the search,
/// the count going up to the replays made.
#[test]
fn fit_says_which_replay_it_is_on() {
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let opts = ReadOptions {
        working: Some(note),
        ..ReadOptions::default()
    };
    let mut ask = Ask::largest(10, 64);
    ask.batches = vec![10, 20, 40];
    let f = crate::report::analysis::fit(&trace, &ask, &opts).unwrap();
    let said = SAID.lock().unwrap().clone();
    for setting in ["the defaults", "expandable_segments:True"] {
        for batch in [10, 20, 40] {
            let line = format!("fit: replaying {setting} at batch {batch} (");
            assert!(
                said.iter().any(|l| l.starts_with(&line)),
                "{line} in {said:?}"
            );
        }
    }
    assert_eq!(f.settings.len(), 2);
    // Each replay said once, numbered from 0.
    let mut counts: Vec<u64> = said
        .iter()
        .filter_map(|l| l.rsplit_once('(')?.1.split(' ').next()?.parse().ok())
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, (0..said.len() as u64).collect::<Vec<_>>());
    assert!(said.len() > 6, "the search replays too: {said:?}");
}

/// A setting is the trace's text: named for a terminal with its control characters escaped.
#[test]
fn a_settings_name_escapes_what_a_terminal_would_obey() {
    let named = setting_name("pinned_use_cuda_host_register:\u{1b}[2J");
    assert!(!named.contains('\u{1b}'), "{named}");
    assert!(
        named.starts_with("pinned_use_cuda_host_register:"),
        "{named}"
    );
    assert_eq!(setting_name(""), "the defaults");
}
