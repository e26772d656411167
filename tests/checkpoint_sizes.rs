//! A checkpoint's header is read within memory of its size: the sizes it declares are counted
//! before anything is built from them. (Its own test binary: it counts every allocation.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use safetensors::tensor::{Dtype, TensorView};
use tapejit::checkpoint::Checkpoint;
use tapejit::Error;

/// The system allocator, counting the bytes live and the most ever live at once.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is the system allocator's, with the same arguments; the counters only
// observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// An MLP 1-1's file whose metadata claims an architecture of `sizes` sizes.
fn mlp_file_claiming(sizes: usize) -> Vec<u8> {
    let one = 1.0f64.to_le_bytes();
    let views = [
        (
            "layers.0.weight",
            TensorView::new(Dtype::F64, vec![1, 1], &one).unwrap(),
        ),
        (
            "layers.0.bias",
            TensorView::new(Dtype::F64, vec![1], &one).unwrap(),
        ),
    ];
    let metadata = HashMap::from([
        ("format".to_string(), "tapejit".to_string()),
        ("architecture".to_string(), vec!["1"; sizes].join("-")),
        ("checksum".to_string(), "0".repeat(16)),
    ]);
    safetensors::serialize(views, Some(metadata)).unwrap()
}

#[test]
fn a_checkpoints_declared_sizes_are_counted_before_they_are_expanded() {
    // An 8 MB header: four million sizes, for a file of two tensors.
    let bytes = mlp_file_claiming(4_000_000);
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let read = Checkpoint::from_bytes(&bytes, "claims");
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        matches!(&read, Err(Error::Checkpoint { problem, .. }) if problem.contains("4000000 sizes")),
        "{read:?}"
    );
    // Parsing the header costs a few times its size; expanding the sizes, 1 GB.
    assert!(
        peak < 8 * bytes.len(),
        "{peak} bytes at most for a {} byte file",
        bytes.len()
    );
}
