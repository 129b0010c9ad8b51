//! `gpushim run`: its values, its refusals and where traces go.

use super::*;

#[test]
fn an_existing_preload_is_kept_after_the_shim() {
    let v = preload_value(Path::new("/x/libgpushim.so"), Some("/y/libfoo.so".into()));
    assert_eq!(v, OsString::from("/x/libgpushim.so:/y/libfoo.so"));
    let v = preload_value(Path::new("/x/libgpushim.so"), Some("".into()));
    assert_eq!(v, OsString::from("/x/libgpushim.so"));
}

#[test]
fn pluggable_adds_expandable_unless_a_pool_is_named() {
    assert_eq!(TorchRoute::Pluggable.conf(None).unwrap(), "pool:expandable");
    assert_eq!(
        TorchRoute::Pluggable.conf(Some("stacks:off")).unwrap(),
        "pool:expandable,stacks:off"
    );
    assert_eq!(
        TorchRoute::Pluggable.conf(Some("pool:caching")).unwrap(),
        "pool:caching"
    );
}

#[test]
fn per_tensor_adds_the_pool_unless_one_is_named() {
    assert_eq!(
        TorchRoute::PerTensor.conf(None).unwrap(),
        "pool:caching,medium:20MiB"
    );
    assert_eq!(
        TorchRoute::PerTensor.conf(Some("stacks:on")).unwrap(),
        "pool:caching,medium:20MiB,stacks:on"
    );
    assert_eq!(
        TorchRoute::PerTensor.conf(Some("pool:expandable")).unwrap(),
        "pool:expandable"
    );
    // A key given later wins: medium can be turned off.
    let c = crate::config::parse_strict(&TorchRoute::PerTensor.conf(Some("medium:off")).unwrap())
        .unwrap();
    assert_eq!(c.medium, 0);
    let c = crate::config::parse_strict(&TorchRoute::PerTensor.conf(None).unwrap()).unwrap();
    assert_eq!(c.medium, 20 << 20);
}

#[test]
fn each_refusal_is_typed_and_says_what_to_do() {
    let dir = std::env::temp_dir().join(format!("gpushim-run-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = find_shim(Some(&dir.join("absent.so"))).unwrap_err();
    assert!(
        matches!(
            e,
            RunError::LibMissing {
                source: "--lib ",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().ends_with("absent.so: no such file"), "{e}");
    let missing = format!("{}/no/such/folder/t.%p.trace", dir.display());
    let e = check_trace(Some(&missing)).unwrap_err();
    assert!(
        matches!(e, RunError::TraceFolder(_, FolderProblem::Missing)),
        "{e:?}"
    );
    assert!(e.to_string().contains("does not exist: create it"), "{e}");
    let e = check_trace(Some("t.%q.trace")).unwrap_err();
    assert!(
        matches!(
            e,
            RunError::Pattern(_, crate::trace::recorder::PatternError::UnknownEscape(b'q'))
        ),
        "{e:?}"
    );
    assert!(std::error::Error::source(&e).is_some());
    let kept = dir.join("kept.trace");
    std::fs::write(&kept, b"x").unwrap();
    // A name already taken is no refusal: the trace takes another name.
    assert!(check_trace(kept.to_str()).is_ok_and(|on| on));
    assert!(check_trace(Some("off")).is_ok_and(|on| !on));
    let e = run(Path::new("/x.so"), None, None, TorchRoute::Cache, &[])
        .err()
        .unwrap();
    assert!(matches!(e, RunError::NothingToRun), "{e:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
