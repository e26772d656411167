//! The native calling convention, written once. Each entry point is a name and the Rust type
//! of a pointer to it; the emitter declares the IR function from that type
//! ([`Entry::params`]) and the engine calls the code under it, so the two cannot disagree.
//!
//! Every generated function takes the values and the gradients buffers first (`vals`,
//! `grads`: one `f64` per address of the plan's `Buffers`, `noalias`); what follows is the
//! entry's own. Pointers are IR `ptr`, `f64` is `double`, `i64` and `u64` are `i64`.

use std::marker::PhantomData;

/// An IR parameter type after the two buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    Ptr,
    F64,
    I64,
}

/// A Rust type a native function takes, with its IR type.
pub trait NativeParam {
    const PARAM: Param;
}

impl NativeParam for f64 {
    const PARAM: Param = Param::F64;
}
impl NativeParam for i64 {
    const PARAM: Param = Param::I64;
}
impl NativeParam for *const f64 {
    const PARAM: Param = Param::Ptr;
}
impl NativeParam for *mut f64 {
    const PARAM: Param = Param::Ptr;
}
impl NativeParam for *mut i64 {
    const PARAM: Param = Param::Ptr;
}
impl NativeParam for *mut u64 {
    const PARAM: Param = Param::Ptr;
}

/// A native function's pointer type: `unsafe extern "C" fn(vals, grads, ...)`, and the IR
/// types of what follows the buffers.
pub trait Signature: Copy {
    const PARAMS: &'static [Param];
}

macro_rules! signature {
    ($($arg:ident),*) => {
        impl<$($arg: NativeParam),*> Signature for unsafe extern "C" fn(*mut f64, *mut f64 $(, $arg)*) {
            const PARAMS: &'static [Param] = &[$($arg::PARAM),*];
        }
    };
}
signature!();
signature!(A);
signature!(A, B);
signature!(A, B, C, D);
signature!(A, B, C, D, E, F);
signature!(A, B, C, D, E, F, G);

/// A generated function's name and signature.
pub struct Entry<F> {
    pub name: &'static str,
    signature: PhantomData<F>,
}

impl<F: Signature> Entry<F> {
    const fn new(name: &'static str) -> Entry<F> {
        Entry {
            name,
            signature: PhantomData,
        }
    }

    /// The IR types of the parameters after the two buffers.
    pub fn params(&self) -> &'static [Param] {
        F::PARAMS
    }
}

/// `forward(vals, grads)`, `backward(vals, grads)`, `materialize(vals, grads)` (stores the
/// gradients `step` deferred).
pub type PassFn = unsafe extern "C" fn(*mut f64, *mut f64);
/// `update(vals, grads, lr)`; `step(vals, grads, lr)`: zero_grad, forward, backward, update.
pub type UpdateFn = unsafe extern "C" fn(*mut f64, *mut f64, f64);
/// `train(vals, grads, lr, inputs, n, losses, guard, trained)`: `step` on `n` samples, where
/// the plan merges a first layer (`guard`: the word of its zero-skipping,
/// [`crate::plan::ZeroSkip`]; `trained`: how many samples ran, where one is not finite).
pub type TrainFn =
    unsafe extern "C" fn(*mut f64, *mut f64, f64, *const f64, i64, *mut f64, *mut i64, *mut i64);
/// `accumulate(vals, grads, inputs, n, losses, guard)`: params' gradients zeroed, then
/// forward and backward on each of `n` samples (`guard`: bit 0 says the weights of `train`'s
/// dot are finite).
pub type AccumulateFn =
    unsafe extern "C" fn(*mut f64, *mut f64, *const f64, i64, *mut f64, *mut i64);
/// `acc_head(vals, grads, sample, guard, from, to, start, ahead)`: a split minibatch's sums
/// continued over rows `from..to` (`emit/split.rs`).
pub type HeadFn =
    unsafe extern "C" fn(*mut f64, *mut f64, *const f64, *mut i64, i64, i64, i64, *const f64);
/// `acc_rest(vals, grads, sample, loss)`: the rest of a sample from its finished sums.
pub type RestFn = unsafe extern "C" fn(*mut f64, *mut f64, *const f64, *mut f64);
/// `acc_tail(vals, grads, samples, n, from, to, sums_grads, chunk, masks)`: the weights'
/// gradients of rows `from..to` for a whole minibatch.
pub type TailFn =
    unsafe extern "C" fn(*mut f64, *mut f64, *const f64, i64, i64, i64, *const f64, i64, *mut u64);

pub const FORWARD: Entry<PassFn> = Entry::new("forward");
pub const BACKWARD: Entry<PassFn> = Entry::new("backward");
pub const UPDATE: Entry<UpdateFn> = Entry::new("update");
pub const STEP: Entry<UpdateFn> = Entry::new("step");
pub const MATERIALIZE: Entry<PassFn> = Entry::new("materialize");
pub const TRAIN: Entry<TrainFn> = Entry::new("train");
pub const ACCUMULATE: Entry<AccumulateFn> = Entry::new("accumulate");
pub const ACC_HEAD: Entry<HeadFn> = Entry::new("acc_head");
pub const ACC_REST: Entry<RestFn> = Entry::new("acc_rest");
pub const ACC_TAIL: Entry<TailFn> = Entry::new("acc_tail");
/// `step`'s update of the params its backward did not update in place (called by `step`
/// only, but with `update`'s convention).
pub const STEP_UPDATE: Entry<UpdateFn> = Entry::new("step_update");
