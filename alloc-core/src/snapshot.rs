//! Reading what `torch.cuda.memory._dump_snapshot()` writes.
//!
//! The file is a pickled dict: `segments` (the allocator's state at dump
//! time: segments with their blocks) and `device_traces` (one list per
//! device of trace entries: `action`, `addr`, `size`, `stream`, frames...).
//! Only the fields replay needs are kept; frames are ignored.

use std::collections::BTreeMap;
use std::io::Read;

use serde_pickle::{DeOptions, HashableValue, Value};

use super::device::{DevicePtr, StreamId};
use super::error::AllocError;

/// What a trace entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceAction {
    /// A block handed to the program (`size` is the unrounded request).
    Alloc,
    /// The program freed a block (it may wait on stream events).
    FreeRequested,
    /// The block went back to the cache.
    FreeCompleted,
    /// `cudaMalloc` of a new segment.
    SegmentAlloc,
    /// `cudaFree` of a segment (empty_cache, or a release before a retry).
    SegmentFree,
    /// Pages mapped into an expandable segment.
    SegmentMap,
    /// Pages unmapped from an expandable segment.
    SegmentUnmap,
    /// A request that ended in an out-of-memory error.
    Oom,
    /// Anything else (`snapshot`, `free` of old versions is mapped to
    /// [`TraceAction::FreeCompleted`]).
    Other(String),
}

/// One entry of a device trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Address of the block or segment.
    pub addr: DevicePtr,
    /// Bytes (request for blocks, segment size for segments).
    pub size: u64,
    /// Stream the block belongs to.
    pub stream: StreamId,
}

/// A block of a segment in the dump-time state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockState {
    /// Start address.
    pub address: DevicePtr,
    /// Rounded size.
    pub size: u64,
    /// Bytes the program asked for.
    pub requested_size: u64,
    /// `active_allocated`, `active_pending_free` or `inactive`.
    pub state: String,
}

/// A segment in the dump-time state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentState {
    /// Device index.
    pub device: usize,
    /// Start address.
    pub address: DevicePtr,
    /// Size of the segment.
    pub total_size: u64,
    /// Stream the segment belongs to.
    pub stream: StreamId,
    /// The segment's blocks, in address order.
    pub blocks: Vec<BlockState>,
}

/// The parts of a memory snapshot that replay uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Allocator state at dump time.
    pub segments: Vec<SegmentState>,
    /// Trace entries per device, oldest first.
    pub device_traces: Vec<Vec<TraceEntry>>,
}

/// Parses a snapshot pickle, gzip-compressed or not.
pub fn parse_snapshot(bytes: &[u8]) -> Result<Snapshot, AllocError> {
    let mut inflated = Vec::new();
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut inflated)
            .map_err(|e| AllocError::Snapshot(format!("bad gzip data: {e}")))?;
        &inflated[..]
    } else {
        bytes
    };
    let value = serde_pickle::value_from_slice(raw, DeOptions::new().replace_unresolved_globals())
        .map_err(|e| AllocError::Snapshot(format!("not a pickle: {e}")))?;
    let Value::Dict(root) = value else {
        return Err(AllocError::Snapshot("the pickle is not a dict".into()));
    };
    let segments = match lookup(&root, "segments") {
        Some(Value::List(items)) => items.iter().map(segment_state).collect::<Result<_, _>>()?,
        Some(_) => return Err(AllocError::Snapshot("\"segments\" is not a list".into())),
        None => Vec::new(),
    };
    let device_traces = match lookup(&root, "device_traces") {
        Some(Value::List(devices)) => devices
            .iter()
            .map(|device| match device {
                Value::List(entries) => entries.iter().map(trace_entry).collect(),
                _ => Err(AllocError::Snapshot("a device trace is not a list".into())),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(AllocError::Snapshot(
                "\"device_traces\" is not a list".into(),
            ));
        }
        None => {
            return Err(AllocError::Snapshot(
                "no \"device_traces\": record with torch.cuda.memory._record_memory_history() \
                 before dumping"
                    .into(),
            ));
        }
    };
    Ok(Snapshot {
        segments,
        device_traces,
    })
}

fn lookup<'a>(dict: &'a BTreeMap<HashableValue, Value>, key: &str) -> Option<&'a Value> {
    dict.get(&HashableValue::String(key.to_owned()))
}

fn as_dict<'a>(
    value: &'a Value,
    what: &str,
) -> Result<&'a BTreeMap<HashableValue, Value>, AllocError> {
    match value {
        Value::Dict(dict) => Ok(dict),
        _ => Err(AllocError::Snapshot(format!("{what} is not a dict"))),
    }
}

/// An integer field; addresses and stream handles are unsigned 64-bit
/// values that pickle may store as negative or as long integers.
fn int_field(dict: &BTreeMap<HashableValue, Value>, key: &str) -> Result<u64, AllocError> {
    match lookup(dict, key) {
        Some(Value::I64(v)) => Ok(*v as u64),
        Some(Value::Int(big)) => big
            .to_string()
            .parse::<u64>()
            .map_err(|_| AllocError::Snapshot(format!("{key} = {big} does not fit 64 bits"))),
        Some(Value::None) | None => Ok(0),
        Some(Value::Bool(b)) => Ok(u64::from(*b)),
        Some(other) => Err(AllocError::Snapshot(format!(
            "{key} is not an integer: {other:?}"
        ))),
    }
}

fn str_field(dict: &BTreeMap<HashableValue, Value>, key: &str) -> String {
    match lookup(dict, key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    }
}

fn trace_entry(value: &Value) -> Result<TraceEntry, AllocError> {
    let dict = as_dict(value, "a trace entry")?;
    let action = match str_field(dict, "action").as_str() {
        "alloc" => TraceAction::Alloc,
        "free_requested" => TraceAction::FreeRequested,
        "free_completed" | "free" => TraceAction::FreeCompleted,
        "segment_alloc" => TraceAction::SegmentAlloc,
        "segment_free" => TraceAction::SegmentFree,
        "segment_map" => TraceAction::SegmentMap,
        "segment_unmap" => TraceAction::SegmentUnmap,
        "oom" => TraceAction::Oom,
        other => TraceAction::Other(other.to_owned()),
    };
    Ok(TraceEntry {
        action,
        addr: int_field(dict, "addr")?,
        size: int_field(dict, "size")?,
        stream: int_field(dict, "stream")?,
    })
}

fn segment_state(value: &Value) -> Result<SegmentState, AllocError> {
    let dict = as_dict(value, "a segment")?;
    let blocks = match lookup(dict, "blocks") {
        Some(Value::List(items)) => items
            .iter()
            .map(|item| {
                let block = as_dict(item, "a block")?;
                Ok(BlockState {
                    address: int_field(block, "address")?,
                    size: int_field(block, "size")?,
                    requested_size: int_field(block, "requested_size")?,
                    state: str_field(block, "state"),
                })
            })
            .collect::<Result<_, AllocError>>()?,
        _ => Vec::new(),
    };
    Ok(SegmentState {
        device: int_field(dict, "device")? as usize,
        address: int_field(dict, "address")?,
        total_size: int_field(dict, "total_size")?,
        stream: int_field(dict, "stream")?,
        blocks,
    })
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
