use super::*;

fn dict(fields: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        fields
            .into_iter()
            .map(|(key, value)| (HashableValue::String(key.into()), value))
            .collect(),
    )
}

fn text(s: &str) -> Value {
    Value::String(s.into())
}

fn pickle(root: &Value) -> Vec<u8> {
    serde_pickle::value_to_vec(root, serde_pickle::SerOptions::new()).unwrap()
}

fn traces(devices: Vec<Vec<Value>>) -> Value {
    Value::List(devices.into_iter().map(Value::List).collect())
}

#[test]
fn trace_entries_keep_their_action_address_size_and_stream() {
    let entry = |action: Value, addr: Value, size: Value, stream: Value| {
        dict(vec![
            ("action", action),
            ("addr", addr),
            ("size", size),
            ("stream", stream),
            ("frames", Value::List(vec![])),
        ])
    };
    let names = [
        ("alloc", TraceAction::Alloc),
        ("free_requested", TraceAction::FreeRequested),
        ("free_completed", TraceAction::FreeCompleted),
        ("free", TraceAction::FreeCompleted),
        ("segment_alloc", TraceAction::SegmentAlloc),
        ("segment_free", TraceAction::SegmentFree),
        ("segment_map", TraceAction::SegmentMap),
        ("segment_unmap", TraceAction::SegmentUnmap),
        ("oom", TraceAction::Oom),
        ("snapshot", TraceAction::Other("snapshot".into())),
    ];
    let mut first: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            entry(
                text(name),
                Value::I64(0x7f00_0000_0000 + i as i64),
                Value::I64(512 * (i as i64 + 1)),
                Value::I64(i as i64),
            )
        })
        .collect();
    // An action pickled as bytes, an address pickled as a negative
    // number (the unsigned value's bits), a missing size, a stream as
    // None and one as a boolean.
    first.push(entry(
        Value::Bytes(b"alloc".to_vec()),
        Value::I64(-2),
        Value::None,
        Value::Bool(true),
    ));
    first.push(dict(vec![("action", text("oom")), ("stream", Value::None)]));
    let root = dict(vec![("device_traces", traces(vec![first, vec![]]))]);
    let snapshot = parse_snapshot(&pickle(&root)).unwrap();
    let mut expected: Vec<TraceEntry> = names
        .into_iter()
        .enumerate()
        .map(|(i, (_, action))| TraceEntry {
            action,
            addr: 0x7f00_0000_0000 + i as u64,
            size: 512 * (i as u64 + 1),
            stream: i as u64,
        })
        .collect();
    expected.push(TraceEntry {
        action: TraceAction::Alloc,
        addr: u64::MAX - 1,
        size: 0,
        stream: 1,
    });
    expected.push(TraceEntry {
        action: TraceAction::Oom,
        addr: 0,
        size: 0,
        stream: 0,
    });
    assert_eq!(snapshot.device_traces, vec![expected, vec![]]);
    assert!(snapshot.segments.is_empty());
}

#[test]
fn segments_keep_their_blocks_in_order() {
    let block = |address: i64, size: i64, requested: i64, state: Value| {
        dict(vec![
            ("address", Value::I64(address)),
            ("size", Value::I64(size)),
            ("requested_size", Value::I64(requested)),
            ("state", state),
        ])
    };
    let root = dict(vec![
        (
            "segments",
            Value::List(vec![
                dict(vec![
                    ("device", Value::I64(1)),
                    ("address", Value::I64(1 << 21)),
                    ("total_size", Value::I64(1 << 22)),
                    ("stream", Value::I64(5)),
                    (
                        "blocks",
                        Value::List(vec![
                            block(1 << 21, 1024, 1000, text("active_allocated")),
                            block(
                                (1 << 21) + 1024,
                                (1 << 22) - 1024,
                                0,
                                Value::Bytes(b"inactive".to_vec()),
                            ),
                        ]),
                    ),
                ]),
                // No blocks recorded.
                dict(vec![
                    ("address", Value::I64(1 << 30)),
                    ("total_size", Value::I64(1 << 21)),
                ]),
            ]),
        ),
        ("device_traces", traces(vec![vec![]])),
    ]);
    let snapshot = parse_snapshot(&pickle(&root)).unwrap();
    let state = |address: u64, size: u64, requested_size: u64, state: &str| BlockState {
        address,
        size,
        requested_size,
        state: state.into(),
    };
    assert_eq!(
        snapshot.segments,
        vec![
            SegmentState {
                device: 1,
                address: 1 << 21,
                total_size: 1 << 22,
                stream: 5,
                blocks: vec![
                    state(1 << 21, 1024, 1000, "active_allocated"),
                    state((1 << 21) + 1024, (1 << 22) - 1024, 0, "inactive"),
                ],
            },
            SegmentState {
                device: 0,
                address: 1 << 30,
                total_size: 1 << 21,
                stream: 0,
                blocks: vec![],
            },
        ]
    );
    assert_eq!(snapshot.device_traces, vec![Vec::<TraceEntry>::new()]);
}

#[test]
fn a_pickle_of_another_shape_is_refused_with_what_is_wrong() {
    let one = || Value::I64(1);
    let alloc_at = |addr: Value| dict(vec![("action", text("alloc")), ("addr", addr)]);
    for (root, wrong) in [
        (Value::List(vec![]), "the pickle is not a dict"),
        (dict(vec![]), "no \"device_traces\""),
        (
            dict(vec![("device_traces", one())]),
            "\"device_traces\" is not a list",
        ),
        (
            dict(vec![("device_traces", Value::List(vec![one()]))]),
            "a device trace is not a list",
        ),
        (
            dict(vec![("device_traces", traces(vec![vec![one()]]))]),
            "a trace entry is not a dict",
        ),
        (
            dict(vec![(
                "device_traces",
                traces(vec![vec![alloc_at(text("0x10"))]]),
            )]),
            "addr is not an integer",
        ),
        (
            dict(vec![("segments", one()), ("device_traces", traces(vec![]))]),
            "\"segments\" is not a list",
        ),
        (
            dict(vec![
                ("segments", Value::List(vec![one()])),
                ("device_traces", traces(vec![])),
            ]),
            "a segment is not a dict",
        ),
        (
            dict(vec![
                (
                    "segments",
                    Value::List(vec![dict(vec![("blocks", Value::List(vec![one()]))])]),
                ),
                ("device_traces", traces(vec![])),
            ]),
            "a block is not a dict",
        ),
    ] {
        let err = parse_snapshot(&pickle(&root)).unwrap_err();
        assert!(
            matches!(&err, AllocError::Snapshot(m) if m.contains(wrong)),
            "{wrong}: {err:?}"
        );
    }
}
