//! `libvramfit_alloc.so`: vramfit's caching allocator (`vramfit_alloc_core`) as
//! PyTorch's CUDA allocator, through `torch.cuda.memory.CUDAPluggableAllocator`,
//! with a hard budget per GPU.
//!
//! The functions PyTorch loads (signatures from
//! `torch/csrc/cuda/CUDAPluggableAllocator.h`, PyTorch 2.11):
//!
//! | symbol | PyTorch hook | C signature |
//! | --- | --- | --- |
//! | `vramfit_alloc` | alloc_fn | `void* (size_t size, int device, cudaStream_t stream)` |
//! | `vramfit_free` | free_fn | `void (void* ptr, size_t size, int device, cudaStream_t stream)` |
//! | `vramfit_init` | `set_init_fn` | `void (int device_count)` |
//! | `vramfit_empty_cache` | `set_reset_fn` (`torch.cuda.empty_cache`) | `void ()` |
//! | `vramfit_memory_fraction` | `set_memory_fraction_fn` | `void (double fraction, int device)` |
//! | `vramfit_record_stream` | `set_record_stream_fn` | `void (void* ptr, cudaStream_t stream)` |
//! | `vramfit_begin_allocate_to_pool` | `set_begin_allocate_to_pool` (CUDA graphs, MemPool) | `void (int, MempoolId_t, std::function<bool(cudaStream_t)>)` |
//!
//! and, for the Python helper, `vramfit_alloc_configure`, `vramfit_alloc_stats_json`,
//! `vramfit_alloc_reset_peaks`, `vramfit_alloc_reset_accumulated`.
//!
//! Configuration (read once, at the first allocation): `VRAMFIT_ALLOC_POLICY`
//! (`pytorch`, default, or `vramfit`), `VRAMFIT_BUDGET_BYTES` (per GPU; 0 or
//! unset: none), `VRAMFIT_STATS_DIR` (where the counters are published),
//! `VRAMFIT_ALLOC_PLAN` (`0` or `off`: the vramfit policy never serves a
//! repeating step from a planned layout; default on).

mod cuda;
pub mod fences;
mod publish;
mod raise;
pub mod state;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use vramfit_alloc_core::{
    AllocatorConfig, DeviceMemory, ExpandableAllocator, GpuAllocator, Policy, PytorchAllocator,
};

use crate::cuda::{Context, CudaEvents, CudaMemory};
use crate::state::{DeviceState, Refusal};
use vramfit_alloc_core::stats_file::AllocCounters;

/// Devices one process can use.
const MAX_DEVICES: usize = 64;

/// What the process runs with, fixed at the first allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Allocation policy.
    pub policy: Policy,
    /// Budget per GPU in bytes.
    pub budget: Option<u64>,
    /// Where counters are published.
    pub stats_dir: Option<PathBuf>,
    /// Whether the vramfit policy plans repeating steps.
    pub step_plan: bool,
}

impl Settings {
    /// Reads `VRAMFIT_ALLOC_POLICY`, `VRAMFIT_BUDGET_BYTES`, `VRAMFIT_STATS_DIR`
    /// through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let policy = match var("VRAMFIT_ALLOC_POLICY") {
            Some(text) if !text.trim().is_empty() => text.trim().parse::<Policy>()?,
            _ => Policy::Pytorch,
        };
        let budget = match var("VRAMFIT_BUDGET_BYTES") {
            Some(text) if !text.trim().is_empty() => {
                let bytes = text.trim().parse::<u64>().map_err(|_| {
                    format!("VRAMFIT_BUDGET_BYTES={text:?} is not a number of bytes")
                })?;
                (bytes > 0).then_some(bytes)
            }
            _ => None,
        };
        let stats_dir = var("VRAMFIT_STATS_DIR")
            .filter(|d| !d.trim().is_empty())
            .map(PathBuf::from);
        let step_plan = match var("VRAMFIT_ALLOC_PLAN") {
            Some(text) => match text.trim().to_ascii_lowercase().as_str() {
                "" | "1" | "on" | "true" => true,
                "0" | "off" | "false" => false,
                _ => return Err(format!("VRAMFIT_ALLOC_PLAN={text:?}: expected on or off")),
            },
            None => true,
        };
        Ok(Self {
            policy,
            budget,
            stats_dir,
            step_plan,
        })
    }
}

type Device = Mutex<DeviceState<CudaEvents>>;

struct Global {
    settings: Settings,
    pid: u32,
    devices: Vec<OnceLock<Result<Device, String>>>,
}

/// Settings given by `vramfit_alloc_configure` before the first allocation.
static OVERRIDE: Mutex<Option<(Option<u64>, Option<Policy>)>> = Mutex::new(None);
static GLOBAL: OnceLock<Result<Global, String>> = OnceLock::new();

fn global() -> Result<&'static Global, String> {
    GLOBAL
        .get_or_init(|| {
            let mut settings = Settings::from_vars(|name| std::env::var(name).ok())?;
            if let Some((budget, policy)) = *lock(&OVERRIDE) {
                settings.budget = budget;
                if let Some(policy) = policy {
                    settings.policy = policy;
                }
            }
            let global = Global {
                settings,
                pid: std::process::id(),
                devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            };
            if let Some(dir) = global.settings.stats_dir.clone() {
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::thread::Builder::new()
                    .name("vramfit-alloc-stats".into())
                    .spawn(move || publish_loop(dir));
            }
            Ok(global)
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn build_allocator<D: DeviceMemory + Send + 'static>(
    policy: Policy,
    device: D,
    config: AllocatorConfig,
) -> Box<dyn GpuAllocator + Send> {
    match policy {
        Policy::Pytorch => Box::new(PytorchAllocator::new(device, config)),
        Policy::Vramfit => Box::new(ExpandableAllocator::new(device, config)),
    }
}

fn device(index: c_int) -> Result<&'static Device, String> {
    let g = global()?;
    if g.pid != std::process::id() {
        return Err(
            "vramfit allocator: CUDA memory cannot be used in a process forked after CUDA was \
             initialised (start worker processes with the 'spawn' method)"
                .into(),
        );
    }
    let slot = usize::try_from(index)
        .ok()
        .and_then(|i| g.devices.get(i))
        .ok_or_else(|| format!("vramfit allocator: device index {index} out of range"))?;
    slot.get_or_init(|| {
        let ctx = Context::primary(index)?;
        let config = AllocatorConfig {
            budget_bytes: g.settings.budget,
            device_index: index as u32,
            disable_step_plan: !g.settings.step_plan,
            ..Default::default()
        };
        let alloc = build_allocator(g.settings.policy, CudaMemory::new(ctx), config);
        Ok(Mutex::new(DeviceState::new(
            alloc,
            CudaEvents::new(ctx),
            g.settings.policy,
            index as u32,
        )))
    })
    .as_ref()
    .map_err(|e| format!("vramfit allocator: cannot use GPU {index}: {e}"))
}

fn publish_loop(dir: PathBuf) {
    let Ok(g) = global() else { return };
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if g.pid != std::process::id() {
            return;
        }
        for slot in &g.devices {
            if let Some(Ok(device)) = slot.get() {
                let published = lock(device).published();
                let _ = publish::write(&dir, g.pid, &published, publish::now_ms());
            }
        }
    }
}

fn publish_now(published: &AllocCounters) {
    if let Ok(g) = global()
        && let Some(dir) = &g.settings.stats_dir
    {
        let _ = publish::write(dir, g.pid, published, publish::now_ms());
    }
}

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("vramfit allocator: internal error: {what}")
}

/// Runs `f` without letting a panic cross into C++; a refusal is thrown to
/// PyTorch once every lock is released.
fn guarded<T>(f: impl FnOnce() -> Result<T, Refusal>) -> T {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    match result {
        Ok(Ok(value)) => value,
        Ok(Err(refusal)) => raise::raise(&refusal.message, refusal.out_of_memory),
        Err(panic) => raise::raise(&panic_text(panic), false),
    }
}

fn refusal(message: String) -> Refusal {
    Refusal {
        message,
        out_of_memory: false,
        budget: false,
    }
}

/// PyTorch's alloc_fn: `size` bytes on `device` for `stream`. A refused
/// request throws (torch.OutOfMemoryError in Python); size 0 gives NULL, as
/// PyTorch's own allocator does.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn vramfit_alloc(
    size: usize,
    device_index: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    let ptr = guarded(|| {
        let device = device(device_index).map_err(refusal)?;
        let mut state = lock(device);
        match state.allocate(size as u64, stream as u64) {
            Ok(ptr) => Ok(ptr),
            Err(refused) => {
                let published = state.published();
                drop(state);
                publish_now(&published);
                Err(refused)
            }
        }
    });
    ptr as *mut c_void
}

/// PyTorch's free_fn.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn vramfit_free(
    ptr: *mut c_void,
    _size: usize,
    device_index: c_int,
    _stream: *mut c_void,
) {
    if ptr.is_null() {
        return;
    }
    guarded(|| {
        let Ok(g) = global() else { return Ok(()) };
        if g.pid != std::process::id() {
            // A forked child cannot use the parent's CUDA memory; nothing to do.
            return Ok(());
        }
        let device = device(device_index).map_err(refusal)?;
        lock(device).free(ptr as u64)
    })
}

/// PyTorch's init hook: called when the allocator is created.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn vramfit_init(_device_count: c_int) {
    let _ = global();
}

/// PyTorch's reset hook (`torch.cuda.empty_cache()`), for every device in use.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn vramfit_empty_cache() {
    guarded(|| {
        let Ok(g) = global() else { return Ok(()) };
        if g.pid != std::process::id() {
            return Ok(());
        }
        for slot in &g.devices {
            if let Some(Ok(device)) = slot.get() {
                lock(device).empty_cache()?;
            }
        }
        Ok(())
    })
}

/// PyTorch's memory-fraction hook (`torch.cuda.set_per_process_memory_fraction`).
#[unsafe(no_mangle)]
pub extern "C-unwind" fn vramfit_memory_fraction(fraction: f64, device_index: c_int) {
    guarded(|| {
        let device = device(device_index).map_err(refusal)?;
        lock(device).set_memory_fraction(fraction);
        Ok(())
    })
}

/// `record_stream` calls for pointers no device handed out.
static UNKNOWN_RECORD_STREAMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// PyTorch's record-stream hook (`Tensor.record_stream`).
#[unsafe(no_mangle)]
pub extern "C-unwind" fn vramfit_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guarded(|| {
        let Ok(g) = global() else { return Ok(()) };
        let mut known = false;
        for slot in &g.devices {
            if let Some(Ok(device)) = slot.get() {
                known |= lock(device).record_stream(ptr as u64, stream as u64);
            }
        }
        if !known {
            UNKNOWN_RECORD_STREAMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    })
}

/// PyTorch's hook at the start of CUDA graph capture (and of
/// `torch.cuda.use_mem_pool`): private pools are not supported, which is
/// said here rather than failing later inside the capture. The third
/// argument (a `std::function` passed by invisible reference) is not used.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn vramfit_begin_allocate_to_pool(
    device_index: c_int,
    _pool_id0: u64,
    _pool_id1: u64,
    _filter: *mut c_void,
) {
    raise::raise(
        &format!(
            "vramfit allocator: CUDA graph capture and torch.cuda.MemPool (device {device_index}) are not \
             supported by PyTorch's pluggable allocators; run without CUDA graphs (no \
             torch.compile(mode=\"reduce-overhead\")) or without vramfit's allocator (VRAMFIT_ALLOCATOR=0)"
        ),
        false,
    )
}

/// Sets the budget and policy before the first allocation (the Python
/// helper's `install(budget_bytes)`). `policy` may be NULL (keep the
/// environment's). Returns 0, or -1 once the allocator is in use, -2 for an
/// unknown policy.
///
/// # Safety
/// `policy` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramfit_alloc_configure(
    budget_bytes: u64,
    policy: *const c_char,
) -> c_int {
    if GLOBAL.get().is_some() {
        return -1;
    }
    let policy = if policy.is_null() {
        None
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(policy) }.to_string_lossy();
        match text.parse::<Policy>() {
            Ok(p) => Some(p),
            Err(_) => return -2,
        }
    };
    *lock(&OVERRIDE) = Some(((budget_bytes > 0).then_some(budget_bytes), policy));
    0
}

fn stats_text(device_index: c_int, kind: c_int) -> Option<String> {
    let g = global().ok()?;
    if g.pid != std::process::id() {
        return None;
    }
    let slot = g.devices.get(usize::try_from(device_index).ok()?)?;
    let Some(Ok(device)) = slot.get() else {
        return Some(if kind == 0 {
            "{}".into()
        } else {
            serde_json::json!({"policy": g.settings.policy.to_string(),
                               "budgetBytes": g.settings.budget.unwrap_or(0),
                               "device": device_index, "inUse": false})
            .to_string()
        });
    };
    let state = lock(device);
    Some(if kind == 0 {
        state.torch_stats().to_string()
    } else {
        let p = state.published();
        serde_json::json!({
            "policy": p.policy, "budgetBytes": p.budget_bytes, "device": p.device, "inUse": true,
            "allocatedBytes": p.allocated_bytes, "reservedBytes": p.reserved_bytes,
            "peakAllocatedBytes": p.peak_allocated_bytes, "peakReservedBytes": p.peak_reserved_bytes,
            "numOoms": p.num_ooms, "pendingFrees": state.pending_frees(),
            "recordStreams": state.stream_counters().0, "heldBackFrees": state.stream_counters().1,
            "unknownRecordStreams": UNKNOWN_RECORD_STREAMS.load(std::sync::atomic::Ordering::Relaxed),
            "livePageHighWaterBytes": state.page_figures().map(|f| f.0),
            "headroomBytes": state.page_figures().map(|f| f.1),
            "deviceWaits": state.core_stats().num_device_waits,
            "movedBytes": state.core_stats().moved_bytes,
            "planActive": state.plan_figures().map(|f| f.active),
            "planArenaBytes": state.plan_figures().map(|f| f.arena_bytes),
            "planMaxLiveBytes": state.plan_figures().map(|f| f.max_live_bytes),
            "planStepEvents": state.plan_figures().map(|f| f.step_events),
            "planBlocks": state.plan_figures().map(|f| f.planned_blocks),
            "planServed": state.plan_figures().map(|f| f.served),
            "planActivations": state.plan_figures().map(|f| f.activations),
            "planDeviations": state.plan_figures().map(|f| f.deviations),
            "planRejected": state.plan_figures().map(|f| f.rejected),
            "planRaisedBytes": state.plan_figures().map(|f| f.raised_bytes),
            "statsDir": g.settings.stats_dir.as_ref().map(|d| d.display().to_string()),
        })
        .to_string()
    })
}

/// Writes device `device`'s counters as JSON into `buf` (`kind` 0: the
/// nested form of `torch.cuda.memory_stats_as_nested_dict`; 1: vramfit's
/// own figures). Returns the length of the text (call again with a larger
/// buffer if it exceeds `capacity`), or -1 when there is nothing to report.
///
/// # Safety
/// `buf` points to `capacity` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramfit_alloc_stats_json(
    device_index: c_int,
    kind: c_int,
    buf: *mut c_char,
    capacity: usize,
) -> isize {
    let text = std::panic::catch_unwind(|| stats_text(device_index, kind))
        .ok()
        .flatten();
    let Some(text) = text else { return -1 };
    if text.len() < capacity && !buf.is_null() {
        // SAFETY: `buf` has `capacity` bytes and the text plus NUL fits.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            *buf.add(text.len()) = 0;
        }
    }
    text.len() as isize
}

fn with_device(device_index: c_int, f: impl FnOnce(&mut DeviceState<CudaEvents>)) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if let Ok(g) = global()
            && g.pid == std::process::id()
            && let Some(Some(Ok(device))) = usize::try_from(device_index)
                .ok()
                .and_then(|i| g.devices.get(i))
                .map(|s| s.get())
        {
            f(&mut lock(device));
        }
    }));
}

/// `torch.cuda.reset_peak_memory_stats(device)`.
#[unsafe(no_mangle)]
pub extern "C" fn vramfit_alloc_reset_peaks(device_index: c_int) {
    with_device(device_index, |state| state.reset_peaks());
}

/// `torch.cuda.reset_accumulated_memory_stats(device)`.
#[unsafe(no_mangle)]
pub extern "C" fn vramfit_alloc_reset_accumulated(device_index: c_int) {
    with_device(device_index, |state| state.reset_accumulated());
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
