//! `gpushim simulate`: a recorded pass-through run replayed through the caching engine, and
//! the replay agreeing with what the shim's pool really did.

use crate::common::*;

fn trace_of_train_loop_with(conf: &str) -> TestFile {
    let t = tempdir("simulate").file("loop.trace");
    let out = run(
        &sim().bin("train_loop"),
        Run {
            preload: true,
            trace: Some(&t),
            args: vec!["30".into()],
            env: vec![("GPUSHIM_CONF", conf.into())],
        },
    );
    assert_ok(&out);
    t
}

fn trace_of_train_loop() -> TestFile {
    trace_of_train_loop_with("pool:off")
}

#[test]
fn replaying_a_pooled_run_under_its_own_policy_reproduces_what_the_pool_did() {
    // The example creates a stream, so from then on the pool's fences wait for its
    // checkpoints; the trace records them, and the replay follows them.
    for policy in [
        "pool:caching",
        "pool:caching,max_split:4MiB,round:pow2_4",
        "pool:expandable",
    ] {
        let pooled = trace_of_train_loop_with(policy);
        let out = gpushim::report::analysis::simulate_pool(
            &pooled,
            &[policy.into()],
            &Default::default(),
        )
        .unwrap();
        let (actual, replayed) = (&out[0], &out[1]);
        assert_eq!(
            (replayed.peak_reserved_bytes, replayed.device_allocations),
            (actual.peak_reserved_bytes, actual.device_allocations),
            "{policy}: replayed {replayed:?}, recorded {actual:?}"
        );
    }
}

#[test]
fn replaying_a_pass_through_run_predicts_the_pool_for_a_gpu_that_keeps_up() {
    let off = trace_of_train_loop();
    for policy in [
        "pool:caching",
        "pool:caching,max_split:4MiB,round:pow2_4",
        "pool:expandable",
    ] {
        let predicted =
            &gpushim::report::analysis::simulate_pool(&off, &[policy.into()], &Default::default())
                .unwrap()[1];
        let pooled = trace_of_train_loop_with(policy);
        let actual = &gpushim::report::analysis::simulate_pool(&pooled, &[], &Default::default())
            .unwrap()[0];
        // A block freed with `cudaFree` waits apart from free space until its fence passes:
        // the run's lagging GPU made the pool hold more than a GPU that keeps up would, and
        // never less.
        assert!(
            predicted.peak_reserved_bytes <= actual.peak_reserved_bytes
                && predicted.device_allocations <= actual.device_allocations,
            "{policy}: predicted {predicted:?}, recorded {actual:?}"
        );
    }
}

#[test]
fn caching_needs_fewer_device_allocations_and_reserves_at_least_what_is_live() {
    let t = trace_of_train_loop();
    let out = gpushim::report::analysis::simulate_pool(
        &t,
        &["pool:caching".into(), "pool:caching,max_split:4MiB".into()],
        &Default::default(),
    )
    .unwrap();
    let (rec, caching) = (&out[0], &out[1]);
    assert_eq!(rec.policy, "recorded");
    assert_eq!(
        rec.device_allocations,
        1 + 30 * 8,
        "weights + 6 activations, scratch and history per step"
    );
    assert!(
        caching.device_allocations * 4 < rec.device_allocations,
        "{caching:?}"
    );
    assert!(caching.peak_reserved_bytes >= caching.peak_live_bytes);
    assert!(
        caching.peak_live_bytes >= rec.peak_live_bytes,
        "blocks are at least the requested size"
    );
    assert_eq!(caching.failed_allocations, 0);
    assert!((0.0..1.0).contains(&caching.fragmentation_at_peak));
}

#[test]
fn a_bad_policy_is_refused_with_the_key_named() {
    let t = trace_of_train_loop();
    let out = std::process::Command::new(gpushim_bin())
        .args([
            "simulate",
            t.to_str().unwrap(),
            "--conf",
            "pool:caching,max_splt:1GiB",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'max_splt'"), "{}", stderr(&out));
    let out = std::process::Command::new(gpushim_bin())
        .args(["simulate", t.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(2));
}

#[test]
fn errors_are_typed_and_a_bad_policy_is_found_before_the_trace_is_read() {
    use gpushim::report::analysis::simulate_pool as simulate;
    use gpushim::report::pool_replay::SimulateError;
    let missing = tempdir("simulate-err").file("absent.trace");
    // A bad policy and an unreadable trace: the policy is named, the trace never opened.
    let e = simulate(
        &missing,
        &["pool:caching,max_splt:1GiB".into()],
        &Default::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, SimulateError::Policy { text, .. } if text == "pool:caching,max_splt:1GiB"),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("--conf pool:caching,max_splt:1GiB: "),
        "{e}"
    );
    // A good policy and the same trace: the reader's error, kept as its source.
    let e = simulate(&missing, &["pool:caching".into()], &Default::default()).unwrap_err();
    assert!(matches!(e, SimulateError::Read(_)), "{e:?}");
    assert!(std::error::Error::source(&e).is_some());
    assert!(e.to_string().contains("absent.trace"), "{e}");
}

/// With no `--conf`, the second row is the defaults, named as such (not an empty name).
#[test]
fn the_defaults_row_is_named() {
    let t = train_loop_trace("simulate-defaults");
    let v = report_json(&["simulate"], &[&t]);
    assert_eq!(v[0]["policy"], "recorded", "{v}");
    assert_eq!(v[1]["policy"], "the defaults (nothing set)", "{v}");
}
