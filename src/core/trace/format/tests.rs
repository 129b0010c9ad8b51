use super::*;

#[test]
fn record_round_trips_through_its_bytes() {
    let r = Record {
        kind: RecordKind::AllocAsync,
        api: Api::CudaMallocAsyncPtsz,
        device: 3,
        status: 2,
        thread: 513,
        time_ns: 0x0102_0304_0506_0708,
        ptr: 0x7f00_dead_beef_0000,
        size: (1 << 40) + 17,
        stream: 4242,
    };
    let mut b = [0u8; RECORD_SIZE];
    r.encode_body(&mut b);
    assert_eq!(Record::decode(&b), Some(r));
    assert_eq!(
        Record::commit_of(&b),
        0,
        "the body encoder must leave the commit word alone"
    );
}

#[test]
fn sizes_beyond_48_bits_are_clamped_not_mixed_into_the_stream() {
    let r = Record {
        kind: RecordKind::AddressReserve,
        api: Api::CuMemAddressReserve,
        device: 0,
        status: 0,
        thread: 0,
        time_ns: 0,
        ptr: 0,
        size: u64::MAX,
        stream: 7,
    };
    let mut b = [0u8; RECORD_SIZE];
    r.encode_body(&mut b);
    let d = Record::decode(&b).unwrap();
    assert_eq!(d.size, SIZE_MAX);
    assert_eq!(d.stream, 7);
}

#[test]
fn commit_tags_are_never_zero_and_differ_between_neighbours() {
    for i in 0..100_000u64 {
        assert_ne!(commit_tag(i), 0);
        assert_ne!(commit_tag(i), commit_tag(i + 1));
    }
}

#[test]
fn status_byte_keeps_small_codes_and_folds_large_ones() {
    assert_eq!(status_byte(0), 0);
    assert_eq!(status_byte(35), 35);
    assert_eq!(status_byte(500), STATUS_OTHER);
    assert_eq!(status_byte(-1), STATUS_OTHER);
}

#[test]
fn every_enum_value_decodes_to_itself() {
    for k in RecordKind::ALL {
        assert_eq!(RecordKind::from_u8(*k as u8), Some(*k));
    }
    for a in Api::ALL {
        assert_eq!(Api::from_u8(*a as u8), Some(*a));
    }
    assert_eq!(RecordKind::from_u8(0), None);
    assert_eq!(Api::from_u8(0), None);
}

#[test]
fn python_frames_round_trip_and_never_read_as_native_addresses() {
    let f = py_frame(12345, 678);
    assert_eq!(as_py_frame(f), Some((12345, 678)));
    assert_eq!(as_py_frame(py_frame(1, u32::MAX)), Some((1, 0xff_ffff)));
    // User-space addresses (below 2^56) are never Python frames.
    assert_eq!(as_py_frame(0x7fff_ffff_f000), None);
    assert_eq!(as_py_frame((1 << 56) - 1), None);
}
