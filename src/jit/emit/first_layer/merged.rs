//! `train`'s merged dot: this sample's update of the first layer's weights and the next
//! sample's forward through them, in one pass (the plan's `TrainPlan`); `sparse.rs` skips
//! the steps whose inputs are 0 in both samples.

use inkwell::values::{IntValue, PointerValue, VectorValue};

use super::super::lane_io::{LaneIo, Reps, Vector};
use super::super::{Emit, Emitter, Frame, MergedDot, Samples};
use crate::passes::schedule::{Affine, DotLoop};

impl<'ctx> Emitter<'ctx, '_> {
    /// `train`'s dot: this sample's backward, which updates the weights, and the next
    /// sample's forward, which reads them, in one pass over the weights. The bias (`first`)
    /// is updated first, as in the backward alone; then for `t` from the first (the order of
    /// additions into distinct weights is free, and the next sample's sums must run left to
    /// right) each weight is updated and its product with the next sample's input (read
    /// straight from `train`'s inputs) added to that sample's sums. Where the plan says so,
    /// in lanes, the steps whose inputs are 0 in both samples are skipped
    /// ([`Emitter::sparse_merged_dot`]).
    pub(super) fn merged_dot_backward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
        reps: &Reps<'ctx>,
        samples: Samples<'ctx>,
    ) -> Emit<()> {
        let gs = self.sum_grads::<V>(frame, &dot.sum, reps)?;
        let biases = self.load_first::<V>(frame.vals, dot.sum.first, reps)?;
        let merged = MergedDot {
            frame,
            dot,
            reps: reps.clone(),
            samples,
            g_products: self.fresh(&gs)?,
        };
        let skip = self.plan.step.iter().flat_map(|s| &s.train);
        let sums = match skip.flat_map(|t| &t.skip_zeros).next() {
            // The merged dot runs in lanes (its gradients are deferred, which takes lanes).
            Some(skip) if V::IS_VECTOR => {
                let vectors = |vs: &[V]| -> Vec<VectorValue<'ctx>> {
                    vs.iter()
                        .map(|v| v.as_basic_value_enum().into_vector_value())
                        .collect()
                };
                let g_products = vectors(&merged.g_products);
                let m = merged.with_products(g_products);
                let sums = self.sparse_merged_dot(&m, &vectors(&biases), skip)?;
                sums.into_iter().map(|v| V::from_basic(v.into())).collect()
            }
            _ => self.emit_loop(dot.products.len, false, &biases, |this, t, accs| {
                this.merged_step(&merged, t, accs)
            })?,
        };
        self.store_first(frame.vals, dot.sum.slot, reps, &sums)
    }

    /// Step `t` of `train`'s merged dot: the weights' update from this sample, then the next
    /// sample's products added to `sums`; the new sums.
    pub(super) fn merged_step<V: LaneIo<'ctx>>(
        &self,
        m: &MergedDot<'_, 'ctx, V>,
        t: IntValue<'ctx>,
        sums: &[V],
    ) -> Emit<Vec<V>> {
        let map = &m.dot.products;
        let mut locals = Vec::with_capacity(m.reps.vectors.len());
        for (&lanes, &g) in m.reps.vectors.iter().zip(&m.g_products) {
            let x = self.merged_operands(m, m.samples.this, t, lanes)?;
            locals.push(self.product_grads(map, lanes, &x, g)?);
        }
        self.accumulate_args(m.frame, map, t, &m.reps, &locals)?;
        self.merged_forward_step(m, t, sums)
    }

    /// The next sample's products at step `t` of `train`'s merged dot (with the weights as
    /// they are) added to `sums`.
    pub(super) fn merged_forward_step<V: LaneIo<'ctx>>(
        &self,
        m: &MergedDot<'_, 'ctx, V>,
        t: IntValue<'ctx>,
        sums: &[V],
    ) -> Emit<Vec<V>> {
        let map = &m.dot.products;
        m.reps
            .vectors
            .iter()
            .zip(sums)
            .map(|(&lanes, &acc)| {
                let x = self.merged_operands(m, m.samples.next, t, lanes)?;
                let mut ar = self.arith::<V>(lanes);
                let product = map.op.forward(&mut ar, &x);
                ar.finish()?;
                self.add_to_sum(acc, product)
            })
            .collect()
    }

    /// The operands of `train`'s merged dot at step `t`: params from `vals`, a sample's
    /// input from `train`'s argument `inputs` (`train` does not copy them into `vals`; the
    /// plan made it one input per step, shared by the lanes).
    fn merged_operands<V: LaneIo<'ctx>>(
        &self,
        m: &MergedDot<'_, 'ctx, V>,
        inputs: PointerValue<'ctx>,
        t: IntValue<'ctx>,
        lanes: Vector,
    ) -> Emit<Vec<V>> {
        let map = &m.dot.products;
        map.args
            .iter()
            .zip(&map.grad_args)
            .map(|(&a, &param)| {
                if param {
                    return V::load(self, m.frame.vals, a, t, &m.reps, lanes);
                }
                self.sample_input(inputs, a, t, lanes)
            })
            .collect()
    }

    /// Input slots `a` at step `t`, read from a sample in memory (`sample`) rather than the
    /// values buffer, in every lane.
    pub(super) fn sample_input<V: LaneIo<'ctx>>(
        &self,
        sample: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        lanes: Vector,
    ) -> Emit<V> {
        let at = self.address_ptr(sample, self.sample_affine(a), t, &[])?;
        let x = self.builder.build_load(self.f64_type(), at, "x")?;
        V::shared(self, x.into_float_value(), lanes)
    }

    /// Input slots `a` as addresses in one sample of `train`'s argument.
    pub(super) fn sample_affine(&self, a: Affine) -> Affine {
        let a = self.plan.buffers.affine(a);
        let inputs = self.plan.buffers.params_len(self.tape);
        Affine {
            base: a.base - inputs as i64,
            ..a
        }
    }
}
