//! What a user can observe of a compiled program, and that it never depends on how the JIT
//! laid the tape out:
//!
//! 1. Products fused into a sum (loop recovery's `DotLoop`) are not kept by the JIT: reading
//!    them is `Error::NotKept`, unless they are outputs or recovery is off.
//! 2. Inputs made without gradient (`Graph::input_without_grad`) get no gradient on any
//!    backend, and change no other gradient.
//! 3. The param layout pass moves params to other slots, but `params`, `set_params`,
//!    `param_grads`, `value` and `grad` keep speaking creation order.
//! 4. `Tape::with_param_layout` accepts permutations only.
//! 5. Checkpoints move params between the JIT and the interpreter bit for bit.
//! 6. `step` returns the loss before the update, whether the loss is computed or a leaf.
//! 7. After `step` or `train` (which may leave the JIT's gradients of fused products
//!    unstored), whatever public methods follow, in any order, observe the interpreter's bits.
//!
//! (1b: a rollout step's intermediate results keep their values but not their gradients,
//! which live in registers.)

mod common;

use std::iter::once;
use std::path::PathBuf;

use common::{
    assert_backends_agree, interpreter, interpreter_and_every_jit_level, jit_with, Backend,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::checkpoint::Checkpoint;
use tapejit::jit::MIN_LOOP_RUN as MIN_RUN;
use tapejit::nn::{self, Activation, Classifier, Layer, MLP};
use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program, Slot, Tape, Tiering, Value};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Bit patterns, so that `assert_eq!` tells `-0.0` from `0.0` and compares NaNs.
fn bits(xs: &[f64]) -> Vec<u64> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// Every backend but the interpreter: the JIT at every level, recovery on and off.
fn every_jit(g: &Graph) -> Vec<Backend> {
    interpreter_and_every_jit_level(g).split_off(1)
}

/// A neuron written the way `nn::Neuron` writes it, `tanh(b + w0*x0 + w1*x1 + ...)`, with
/// its products at hand (a `Neuron` does not expose them).
struct Dot<'g> {
    w: Vec<Value<'g>>,
    b: Value<'g>,
    x: Vec<Value<'g>>,
    products: Vec<Value<'g>>,
    sum: Value<'g>,
    loss: Value<'g>,
}

/// A [`Dot`] of `n` products, its `tanh` as the loss.
fn dot(g: &Graph, n: usize) -> Dot<'_> {
    let x = g.inputs(n);
    let w: Vec<Value> = (0..n).map(|i| g.param(0.25 - 0.05 * i as f64)).collect();
    let b = g.param(0.1);
    let products: Vec<Value> = w.iter().zip(&x).map(|(&w, &x)| w * x).collect();
    let sum = g.sum(once(b).chain(products.iter().copied()));
    let loss = sum.tanh();
    g.set_loss(loss).unwrap();
    Dot {
        w,
        b,
        x,
        products,
        sum,
        loss,
    }
}

/// Inputs for a [`Dot`] of `n` products, none of them 0 (so every product is informative).
fn dot_inputs(n: usize) -> Vec<f64> {
    (0..n).map(|i| 0.3 * i as f64 - 1.15).collect()
}

/// Runs forward and backward on `inputs`.
fn forward_backward(p: &mut dyn Program, inputs: &[f64]) {
    p.set_inputs(inputs).unwrap();
    p.forward();
    p.backward().unwrap();
}

/// `value` and `grad` of `v` on `p`, as bits, or the error.
fn read(p: &dyn Program, v: Value<'_>) -> Result<(u64, u64), Error> {
    Ok((p.value(v)?.to_bits(), p.grad(v)?.to_bits()))
}

// ---------------------------------------------------------------------------------------------
// 1. Fused products are not kept
// ---------------------------------------------------------------------------------------------

#[test]
fn the_jit_does_not_keep_products_fused_into_their_sum() {
    let g = Graph::new();
    let d = dot(&g, 12);
    let inputs = dot_inputs(12);
    let mut reference = interpreter(&g);
    forward_backward(reference.program.as_mut(), &inputs);
    for level in OptLevel::ALL {
        let mut jit = jit_with(&g, level, true);
        forward_backward(jit.program.as_mut(), &inputs);
        let (j, r) = (jit.program.as_ref(), reference.program.as_ref());
        for &p in &d.products {
            let slot = j.tape().slot(p).unwrap();
            assert!(
                !j.is_kept(slot),
                "{}: product #{} is kept",
                jit.name,
                p.id()
            );
            assert!(r.is_kept(r.tape().slot(p).unwrap()));
            let expected = Err(Error::NotKept { node: p.id() });
            assert_eq!(j.value(p), expected, "{}: value of #{}", jit.name, p.id());
            assert_eq!(j.grad(p), expected, "{}: grad of #{}", jit.name, p.id());
            // The interpreter keeps every slot.
            assert!(r.value(p).is_ok() && r.grad(p).is_ok());
        }
        // Everything around the products is kept, with the interpreter's bits.
        let around = d.w.iter().chain(&d.x).chain([&d.b, &d.sum, &d.loss]);
        for &v in around {
            assert_eq!(read(j, v), read(r, v), "{}: #{}", jit.name, v.id());
        }
    }
}

#[test]
fn every_value_and_grad_recomputes_fused_products_with_the_interpreters_bits() {
    let g = Graph::new();
    let d = dot(&g, 12);
    let mut inputs = dot_inputs(12);
    // A -0 product, whose gradient `0 + g` is +0 where a -0 would show.
    inputs[3] = -0.0;
    let everything: Vec<Value> = (d.w.iter().chain(&d.x).chain(&d.products))
        .chain([&d.b, &d.sum, &d.loss])
        .copied()
        .collect();
    let every = |p: &dyn Program, v: Value<'_>| {
        let (values, grads) = p.every_value_and_grad();
        let slot = p.tape().slot(v).unwrap().index();
        (values[slot].to_bits(), grads[slot].to_bits())
    };
    let mut reference = interpreter(&g);
    let mut jits = every_jit(&g);
    // Twice: params' gradients accumulate, the others start from 0.
    for p in once(&mut reference).chain(&mut jits) {
        forward_backward(p.program.as_mut(), &inputs);
        p.program.step(&inputs, 0.1).unwrap();
        forward_backward(p.program.as_mut(), &inputs);
        forward_backward(p.program.as_mut(), &inputs);
    }
    for jit in &jits {
        for &v in &everything {
            let (j, r) = (jit.program.as_ref(), reference.program.as_ref());
            assert_eq!(
                every(j, v),
                read(r, v).unwrap(),
                "{}: #{}",
                jit.name,
                v.id()
            );
        }
    }
}

#[test]
fn not_kept_says_which_node_and_how_to_keep_it() {
    let g = Graph::new();
    let d = dot(&g, 12);
    let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    let p = d.products[5];
    let error = jit.value(p).unwrap_err();
    assert_eq!(error, Error::NotKept { node: p.id() });
    let message = error.to_string();
    for fragment in [format!("#{}", p.id()).as_str(), "mark it as an output"] {
        assert!(
            message.contains(fragment),
            "{message:?} does not mention {fragment:?}"
        );
    }
}

#[test]
fn products_of_an_nn_layer_are_the_only_slots_the_jit_drops() {
    // `nn` builds exactly the pattern that fuses; every product of every neuron is fused and
    // nothing else is (the loss squares with `powf`, so it has no products of its own).
    let g = Graph::new();
    let layer = Layer::new(&g, 10, 6, Activation::Tanh, &mut StdRng::seed_from_u64(1));
    let x = g.inputs(10);
    let out = layer.call(&x).unwrap();
    g.set_loss(g.sum(out.iter().map(|&o| o.powf(2.0)))).unwrap();
    let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    let tape = jit.tape();
    let dropped: Vec<Slot> = tape.slots().filter(|&s| !jit.is_kept(s)).collect();
    assert_eq!(dropped.len(), 10 * 6, "dropped slots: {dropped:?}");
    for s in dropped {
        assert_eq!(
            tape.node(s).unwrap().op.name(),
            "mul",
            "slot {s:?} is dropped"
        );
    }
    for &h in layer.params().iter().chain(&x).chain(&out) {
        assert!(jit.is_kept(tape.slot(h).unwrap()), "#{} not kept", h.id());
    }
}

#[test]
fn a_product_marked_as_output_is_kept_with_the_interpreters_bits() {
    let g = Graph::new();
    let d = dot(&g, 12);
    let marked = [d.products[0], d.products[7], d.products[11]];
    for &p in &marked {
        g.add_output(p).unwrap();
    }
    let inputs = dot_inputs(12);
    let mut reference = interpreter(&g);
    forward_backward(reference.program.as_mut(), &inputs);
    let r = reference.program.as_ref();
    for mut jit in every_jit(&g) {
        forward_backward(jit.program.as_mut(), &inputs);
        let j = jit.program.as_ref();
        for &p in &marked {
            assert!(j.is_kept(j.tape().slot(p).unwrap()), "{}", jit.name);
            assert_eq!(read(j, p), read(r, p), "{}: product #{}", jit.name, p.id());
        }
        assert_eq!(bits(&j.outputs()), bits(&r.outputs()), "{}", jit.name);
    }
}

#[test]
fn a_product_that_is_the_loss_is_kept() {
    // The loss counts as a reader, like an output: a product that is the loss is not fused
    // into the sum that also reads it.
    let g = Graph::new();
    let d = dot(&g, 12);
    g.add_output(d.loss).unwrap();
    let product = d.products[4];
    g.set_loss(product).unwrap();
    let inputs = dot_inputs(12);
    let mut reference = interpreter(&g);
    forward_backward(reference.program.as_mut(), &inputs);
    let r = reference.program.as_ref();
    for mut jit in every_jit(&g) {
        let loss = jit.program.step(&inputs, 0.0).unwrap();
        assert_eq!(loss.to_bits(), r.loss().unwrap().to_bits(), "{}", jit.name);
        let j = jit.program.as_ref();
        assert_eq!(read(j, product), read(r, product), "{}", jit.name);
        assert_eq!(bits(&j.outputs()), bits(&r.outputs()), "{}", jit.name);
    }
}

#[test]
fn without_loop_recovery_the_jit_keeps_every_slot() {
    let g = Graph::new();
    let d = dot(&g, 12);
    let inputs = dot_inputs(12);
    let mut reference = interpreter(&g);
    forward_backward(reference.program.as_mut(), &inputs);
    let r = reference.program.as_ref();
    for level in OptLevel::ALL {
        let mut jit = jit_with(&g, level, false);
        forward_backward(jit.program.as_mut(), &inputs);
        let j = jit.program.as_ref();
        assert!(j.tape().slots().all(|s| j.is_kept(s)), "{}", jit.name);
        for &p in &d.products {
            assert_eq!(read(j, p), read(r, p), "{}: product #{}", jit.name, p.id());
        }
    }
}

#[test]
fn runs_shorter_than_min_run_are_not_fused() {
    // The boundary of "a loop pays": MIN_RUN products fuse, one fewer stays straight-line.
    for (n, fused) in [(MIN_RUN as usize, true), (MIN_RUN as usize - 1, false)] {
        let g = Graph::new();
        let d = dot(&g, n);
        let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
        for &p in &d.products {
            let kept = jit.is_kept(jit.tape().slot(p).unwrap());
            assert_eq!(kept, !fused, "{n} products: #{} kept = {kept}", p.id());
        }
    }
}

#[test]
fn fused_products_stay_unkept_after_step() {
    // `step` runs its own backward (and may defer gradients); that changes nothing visible.
    let g = Graph::new();
    let d = dot(&g, 16);
    let inputs = dot_inputs(16);
    let mut reference = Interpreter::new(&g).unwrap();
    let mut jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    for _ in 0..3 {
        let expected = reference.step(&inputs, 0.1).unwrap();
        assert_eq!(
            jit.step(&inputs, 0.1).unwrap().to_bits(),
            expected.to_bits()
        );
    }
    for &p in &d.products {
        assert_eq!(jit.grad(p), Err(Error::NotKept { node: p.id() }));
    }
    assert_eq!(bits(&jit.param_grads()), bits(&reference.param_grads()));
    for &x in &d.x {
        assert_eq!(read(&jit, x), read(&reference, x), "input #{}", x.id());
    }
}

/// A rollout of 40 steps over 6 states, `x' = x + ((x - left) * k - x * x * 0.01)` (`k =
/// -0.2`: every number stays finite), each step's differences `x - left` and decays `x * x *
/// 0.01` (read by a subtraction only, whose derivative reads no value), and (marked as an
/// output) the first state's difference.
struct Rollout<'g> {
    states: Vec<Value<'g>>,
    differences: Vec<Value<'g>>,
    decays: Vec<Value<'g>>,
    marked: Vec<Value<'g>>,
}

fn rollout(g: &Graph) -> Rollout<'_> {
    let k = g.param(-0.2);
    let mut x: Vec<Value> = g.inputs(6);
    let (mut states, mut differences, mut marked) = (Vec::new(), Vec::new(), Vec::new());
    let mut decays = Vec::new();
    for _ in 0..40 {
        x = (0..x.len())
            .map(|i| {
                let difference = x[i] - x[i.saturating_sub(1)];
                match i {
                    0 => marked.push(difference),
                    _ => differences.push(difference),
                }
                let decay = x[i] * x[i] * 0.01;
                decays.push(decay);
                x[i] + (difference * k - decay)
            })
            .collect();
        states.extend(&x);
    }
    for &m in &marked {
        g.add_output(m).unwrap();
    }
    g.set_loss(g.sum(x.iter().map(|&v| v * v))).unwrap();
    Rollout {
        states,
        differences,
        decays,
        marked,
    }
}

/// 1b. A rollout step's intermediate results (whose gradients come from the same step
/// alone) keep their gradients in registers: their values are kept, their gradients are
/// not (`Error::NotKept`); those no derivative reads keep their values in registers too.
/// `every_value_and_grad` recomputes both with the interpreter's bits. The states the next
/// step reads, and what the user marked as outputs, are kept.
#[test]
fn a_rollouts_intermediate_gradients_live_in_registers() {
    let g = Graph::new();
    let r = rollout(&g);
    let inputs: Vec<f64> = (0..6).map(|i| 0.5 - 0.2 * i as f64).collect();
    let mut reference = interpreter(&g);
    forward_backward(reference.program.as_mut(), &inputs);
    let every = |p: &dyn Program| {
        let (values, grads) = p.every_value_and_grad();
        let from = p.tape().num_params();
        (bits(&values[from..]), bits(&grads[from..]))
    };
    for level in OptLevel::ALL {
        let mut jit = jit_with(&g, level, true);
        forward_backward(jit.program.as_mut(), &inputs);
        let (j, e) = (jit.program.as_ref(), reference.program.as_ref());
        let tape = j.tape();
        let local = |v: Value| !j.is_kept(tape.slot(v).unwrap());
        assert!(
            r.differences.iter().filter(|&&d| local(d)).count() > r.differences.len() / 2,
            "{}: most differences keep their gradients in memory",
            jit.name
        );
        for &d in r.differences.iter().filter(|&&d| local(d)) {
            assert_eq!(
                j.grad(d),
                Err(Error::NotKept { node: d.id() }),
                "{}",
                jit.name
            );
            let value = j.value(d).map(f64::to_bits);
            assert_eq!(value, e.value(d).map(f64::to_bits), "{}", jit.name);
        }
        let unkept = r.decays.iter().filter(|&&d| j.value(d).is_err()).count();
        assert!(
            unkept > r.decays.len() / 2,
            "{}: most decays keep their values in memory",
            jit.name
        );
        for &d in &r.decays {
            let expected = Err(Error::NotKept { node: d.id() });
            if j.value(d).is_err() {
                assert_eq!(j.value(d), expected, "{}", jit.name);
                assert_eq!(j.grad(d), expected, "{}", jit.name);
            }
        }
        for &v in r.states.iter().chain(&r.marked) {
            assert_eq!(read(j, v), read(e, v), "{}: #{}", jit.name, v.id());
        }
        let (got, expected) = (every(j), every(e));
        for (what, got, expected) in [("values", got.0, expected.0), ("grads", got.1, expected.1)] {
            let first = (0..got.len()).find(|&i| got[i] != expected[i]);
            assert_eq!(first, None, "{}: every_value_and_grad's {what}", jit.name);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Inputs without gradient
// ---------------------------------------------------------------------------------------------

/// A hand-built expression over three inputs (with or without gradient) and two params. It
/// has a node whose operands are all inputs (`x0 * x1`), an input feeding several nodes, and
/// one feeding a nonlinearity directly. Returns the inputs and params.
fn expression(g: &Graph, with_grad: bool) -> (Vec<Value<'_>>, Vec<Value<'_>>) {
    let x = if with_grad {
        g.inputs(3)
    } else {
        g.inputs_without_grad(3)
    };
    let (a, b) = (g.param(0.7), g.param(-1.3));
    let loss = (a * x[0] + b).tanh() * x[1]
        + (x[0] * x[1] * a).exp() / (x[2] * x[2] + 1.0)
        + (x[2] - b).sigmoid()
        + x[0].tanh() * b;
    g.set_loss(loss).unwrap();
    (x, vec![a, b])
}

const EXPRESSION_INPUTS: [f64; 3] = [0.4, -0.9, 1.6];

#[test]
fn inputs_without_grad_get_no_gradient_on_any_backend() {
    let g = Graph::new();
    let (x, _) = expression(&g, false);
    for mut b in interpreter_and_every_jit_level(&g) {
        // Twice, so nothing can accumulate into an input's gradient either.
        for _ in 0..2 {
            forward_backward(b.program.as_mut(), &EXPRESSION_INPUTS);
            for &xi in &x {
                assert_eq!(b.program.grad(xi).unwrap(), 0.0, "{}: #{}", b.name, xi.id());
            }
        }
        let tape = b.program.tape();
        assert!(x
            .iter()
            .all(|&xi| !tape.node(tape.slot(xi).unwrap()).unwrap().needs_grad));
        b.program.step(&EXPRESSION_INPUTS, 0.01).unwrap();
        for &xi in &x {
            assert_eq!(b.program.grad(xi).unwrap(), 0.0, "{} after step", b.name);
        }
    }
}

#[test]
fn plain_inputs_get_their_micrograd_gradient_on_every_backend() {
    // `loss = w * x`: d loss / d x = w.
    let g = Graph::new();
    let x = g.input();
    let w = g.param(-2.5);
    g.set_loss(w * x).unwrap();
    for mut b in interpreter_and_every_jit_level(&g) {
        forward_backward(b.program.as_mut(), &[1.75]);
        assert_eq!(b.program.grad(x).unwrap(), -2.5, "{}", b.name);
    }
    // And the expression's inputs get the interpreter's (non-zero) gradients everywhere.
    let g = Graph::new();
    let (x, _) = expression(&g, true);
    let mut reference = Interpreter::new(&g).unwrap();
    forward_backward(&mut reference, &EXPRESSION_INPUTS);
    for &xi in &x {
        assert_ne!(reference.grad(xi).unwrap(), 0.0, "#{}", xi.id());
    }
    for mut b in every_jit(&g) {
        forward_backward(b.program.as_mut(), &EXPRESSION_INPUTS);
        for &xi in &x {
            let (got, expected) = (b.program.grad(xi).unwrap(), reference.grad(xi).unwrap());
            assert_eq!(
                got.to_bits(),
                expected.to_bits(),
                "{}: #{}",
                b.name,
                xi.id()
            );
        }
    }
}

/// Runs forward, backward, update, then two steps on `p`; returns every loss and the params
/// and param gradients at the end, as bits.
fn train_briefly(p: &mut dyn Program, samples: &[Vec<f64>; 3]) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    p.set_inputs(&samples[0]).unwrap();
    let mut losses = vec![p.forward()];
    p.backward().unwrap();
    p.update(0.05).unwrap();
    for s in &samples[1..] {
        losses.push(p.step(s, 0.05).unwrap());
    }
    (bits(&losses), bits(&p.params()), bits(&p.param_grads()))
}

/// Asserts that the graphs `build(with_grad)` makes train identically on every backend,
/// whether their inputs take gradients or not.
fn assert_input_grads_change_no_param_grad(
    what: &str,
    build: for<'g> fn(&'g Graph, bool) -> Vec<Value<'g>>,
    samples: [Vec<f64>; 3],
) {
    let (plain, without) = (Graph::new(), Graph::new());
    let plain_x = build(&plain, true);
    let without_x = build(&without, false);
    assert_eq!(plain.num_params(), without.num_params());
    let mut reference = Interpreter::new(&plain).unwrap();
    let expected = train_briefly(&mut reference, &samples);
    let pairs = interpreter_and_every_jit_level(&plain)
        .into_iter()
        .zip(interpreter_and_every_jit_level(&without));
    for (mut a, mut b) in pairs {
        assert_eq!(
            train_briefly(a.program.as_mut(), &samples),
            expected,
            "{what}: {}",
            a.name
        );
        assert_eq!(
            train_briefly(b.program.as_mut(), &samples),
            expected,
            "{what}: {} without input gradients",
            b.name
        );
        for (&xa, &xb) in plain_x.iter().zip(&without_x) {
            let with = a.program.grad(xa).unwrap();
            assert_eq!(with.to_bits(), reference.grad(xa).unwrap().to_bits());
            assert_eq!(b.program.grad(xb).unwrap(), 0.0, "{what}: {}", b.name);
        }
    }
}

#[test]
fn inputs_without_grad_change_no_other_gradient_of_an_expression() {
    fn build(g: &Graph, with_grad: bool) -> Vec<Value<'_>> {
        expression(g, with_grad).0
    }
    let samples = [
        EXPRESSION_INPUTS.to_vec(),
        vec![-0.2, 0.5, -1.1],
        vec![1.3, 0.8, 0.05],
    ];
    assert_input_grads_change_no_param_grad("expression", build, samples);
}

#[test]
fn inputs_without_grad_change_no_other_gradient_of_an_mlp() {
    // 12 inputs, so the first layer's dot products fuse (and, in `step`, fuse the update).
    fn build(g: &Graph, with_grad: bool) -> Vec<Value<'_>> {
        let mlp = MLP::new(g, 12, &[10, 3], &mut StdRng::seed_from_u64(5));
        let n = 12 + 3;
        let io = if with_grad {
            g.inputs(n)
        } else {
            g.inputs_without_grad(n)
        };
        let out = mlp.call(&io[..12]).unwrap();
        g.set_loss(nn::mse(&out, &io[12..]).unwrap()).unwrap();
        io
    }
    let mut rng = StdRng::seed_from_u64(6);
    let mut sample = || {
        (0..15)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect::<Vec<f64>>()
    };
    let samples = [sample(), sample(), sample()];
    assert_input_grads_change_no_param_grad("MLP 12-10-3", build, samples);
}

// ---------------------------------------------------------------------------------------------
// 3. Param layout
// ---------------------------------------------------------------------------------------------

/// The params of `model` in the order `nn` creates them: layer by layer, neuron by neuron,
/// weights then bias.
fn params_in_creation_order<'g>(model: &MLP<'g>) -> Vec<Value<'g>> {
    let mut handles = Vec::new();
    for layer in &model.layers {
        for neuron in &layer.neurons {
            handles.extend(&neuron.w);
            handles.push(neuron.b);
        }
    }
    handles
}

/// A sample for a classifier with `nin` inputs and `classes` classes: inputs, then one-hot.
fn classifier_sample(rng: &mut StdRng, nin: usize, classes: usize) -> Vec<f64> {
    let label = rng.gen_range(0..classes);
    (0..nin)
        .map(|_| rng.gen_range(-1.0..1.0))
        .chain((0..classes).map(|c| if c == label { 1.0 } else { 0.0 }))
        .collect()
}

/// Asserts that `value(handle_k)` is `params()[k]` and `grad(handle_k)` is
/// `param_grads()[k]` for every param.
fn assert_handles_speak_creation_order(at: &str, p: &dyn Program, handles: &[Value<'_>]) {
    let (params, grads) = (p.params(), p.param_grads());
    assert_eq!(handles.len(), params.len(), "{at}");
    for (k, &h) in handles.iter().enumerate() {
        assert_eq!(
            p.value(h).unwrap().to_bits(),
            params[k].to_bits(),
            "{at}: value of param {k}"
        );
        assert_eq!(
            p.grad(h).unwrap().to_bits(),
            grads[k].to_bits(),
            "{at}: grad of param {k}"
        );
    }
}

#[test]
fn the_layout_pass_moves_a_classifiers_params() {
    let g = Graph::new();
    Classifier::new(&g, 20, &[9], 3, &mut StdRng::seed_from_u64(2)).unwrap();
    let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    let p = g.num_params();
    assert_eq!(p, 20 * 9 + 9 + 9 * 3 + 3);
    assert!(
        jit.stats().moved_params > 0,
        "the layout pass moved no param"
    );
    // The program speaks the tape as built, as the interpreter runs it: creation order.
    let reference = Interpreter::new(&g).unwrap();
    let identity: Vec<Slot> = (0..p as u32).map(Slot).collect();
    assert_eq!(reference.tape().param_slots(), &identity[..]);
    assert_eq!(jit.tape().param_slots(), &identity[..]);
}

#[test]
fn params_speak_creation_order_whatever_the_layout() {
    let g = Graph::new();
    let classifier = Classifier::new(&g, 20, &[9], 3, &mut StdRng::seed_from_u64(2)).unwrap();
    let handles = params_in_creation_order(&classifier.model);
    let mut reference = Interpreter::new(&g).unwrap();
    // The handles really are in creation order: the interpreter's tape does not move params.
    for (k, &h) in handles.iter().enumerate() {
        assert_eq!(reference.tape().slot(h).unwrap(), Slot(k as u32));
    }
    let mut rng = StdRng::seed_from_u64(3);
    let samples: Vec<Vec<f64>> = (0..4).map(|_| classifier_sample(&mut rng, 20, 3)).collect();
    let reference_losses: Vec<f64> = samples
        .iter()
        .map(|s| reference.step(s, 0.1).unwrap())
        .collect();
    let fresh = Interpreter::new(&g).unwrap();
    let p = handles.len();
    let new_params: Vec<f64> = (0..p).map(|k| (k as f64 + 1.0) / 1024.0 - 0.1).collect();

    for mut b in every_jit(&g) {
        let at = b.name.clone();
        let jit = b.program.as_mut();
        assert_eq!(
            bits(&jit.params()),
            bits(&fresh.params()),
            "{at}: initial params"
        );
        assert_handles_speak_creation_order(&format!("{at}, initially"), jit, &handles);

        let losses: Vec<f64> = samples.iter().map(|s| jit.step(s, 0.1).unwrap()).collect();
        assert_eq!(bits(&losses), bits(&reference_losses), "{at}: losses");
        assert_eq!(
            bits(&jit.params()),
            bits(&reference.params()),
            "{at}: params"
        );
        assert_eq!(
            bits(&jit.param_grads()),
            bits(&reference.param_grads()),
            "{at}: grads"
        );
        assert_handles_speak_creation_order(&format!("{at}, after steps"), jit, &handles);
        for &h in &handles {
            assert_eq!(read(jit, h), read(&reference, h), "{at}: param #{}", h.id());
        }

        jit.set_params(&new_params).unwrap();
        assert_eq!(bits(&jit.params()), bits(&new_params), "{at}: set_params");
        for (k, &h) in handles.iter().enumerate() {
            assert_eq!(
                jit.value(h).unwrap(),
                new_params[k],
                "{at}: param {k} after set_params"
            );
        }
        // The new params landed where the code reads them: outputs match the interpreter's.
        let mut check = Interpreter::new(&g).unwrap();
        check.set_params(&new_params).unwrap();
        for p in [&mut *jit, &mut check as &mut dyn Program] {
            p.set_inputs(&samples[0]).unwrap();
            p.forward();
        }
        assert_eq!(
            bits(&jit.outputs()),
            bits(&check.outputs()),
            "{at}: outputs"
        );
        assert_eq!(
            jit.loss().unwrap().to_bits(),
            check.loss().unwrap().to_bits()
        );
    }
}

#[test]
fn a_classifier_trains_identically_on_every_backend() {
    // The whole-state comparison (every kept slot, every action of a training script).
    let g = Graph::new();
    Classifier::new(&g, 20, &[9], 3, &mut StdRng::seed_from_u64(2)).unwrap();
    let mut backends = interpreter_and_every_jit_level(&g);
    assert_backends_agree(
        "classifier 20-9-3",
        &mut backends,
        &mut StdRng::seed_from_u64(4),
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Tape::with_param_layout
// ---------------------------------------------------------------------------------------------

/// A tape with four params, all used, and two inputs; one param is also an output, so
/// moving it must move the output too.
fn four_param_graph(g: &Graph) -> Vec<Value<'_>> {
    let x = g.inputs(2);
    let w: Vec<Value> = (0..4).map(|k| g.param(0.5 + 0.25 * k as f64)).collect();
    let y = (w[0] * x[0] + w[1] * x[1]).tanh() * w[2] - w[3];
    g.add_output(y).unwrap();
    g.add_output(w[0]).unwrap();
    g.set_loss(y.powf(2.0)).unwrap();
    w
}

#[test]
fn with_param_layout_rejects_what_is_not_a_permutation() {
    let g = Graph::new();
    four_param_graph(&g);
    let tape = Tape::from_graph(&g).unwrap();
    let bad: [(&str, &[u32]); 7] = [
        ("empty", &[]),
        ("too short", &[0, 1, 2]),
        ("too long", &[0, 1, 2, 3, 4]),
        ("duplicate", &[0, 1, 1, 3]),
        ("out of range", &[0, 1, 2, 4]),
        ("an input's slot", &[0, 1, 2, 5]),
        ("far out of range", &[0, 1, 2, u32::MAX]),
    ];
    for (what, from) in bad {
        let result = tape.with_param_layout(from);
        assert!(
            matches!(result, Err(Error::InvalidTape { .. })),
            "{what} {from:?}: {result:?}"
        );
    }
}

#[test]
fn with_param_layout_accepts_the_identity_and_permutations() {
    let g = Graph::new();
    let w = four_param_graph(&g);
    let tape = Tape::from_graph(&g).unwrap();
    let same = tape.with_param_layout(&[0, 1, 2, 3]).unwrap();
    assert_eq!(same.param_slots(), tape.param_slots());

    // The param in slot `from[s]` moves to slot `s`.
    let from = [2, 0, 3, 1];
    let moved = tape.with_param_layout(&from).unwrap();
    for (s, &f) in from.iter().enumerate() {
        assert_eq!(moved.param_slots()[f as usize], Slot(s as u32));
        assert_eq!(moved.slot(w[f as usize]).unwrap(), Slot(s as u32));
    }
    // Only where params live changed: every backend on the moved tape trains like the
    // interpreter on the original.
    let samples = [vec![0.3, -0.8], vec![1.2, 0.4], vec![-0.6, 0.9]];
    let mut reference = Interpreter::from_tape(tape);
    let mut programs: Vec<(String, Box<dyn Program>)> = vec![(
        "interpreter, moved".into(),
        Box::new(Interpreter::from_tape(moved.clone())),
    )];
    for level in OptLevel::ALL {
        let jit = Jit::builder()
            .tiering(Tiering::Off)
            .opt_level(level)
            .compile_tape(moved.clone())
            .unwrap();
        programs.push((format!("jit {level}, moved"), Box::new(jit)));
    }
    let expected = train_briefly(&mut reference, &samples);
    for (name, mut p) in programs {
        assert_eq!(train_briefly(p.as_mut(), &samples), expected, "{name}");
        assert_eq!(bits(&p.outputs()), bits(&reference.outputs()), "{name}");
        assert_handles_speak_creation_order(&name, p.as_ref(), &w);
    }
}

#[test]
fn with_param_layout_of_a_tape_without_params() {
    let g = Graph::new();
    let x = g.input();
    g.set_loss(x.exp()).unwrap();
    let tape = Tape::from_graph(&g).unwrap();
    assert!(tape.with_param_layout(&[]).is_ok());
    assert!(matches!(
        tape.with_param_layout(&[0]),
        Err(Error::InvalidTape { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// 5. Checkpoints
// ---------------------------------------------------------------------------------------------

/// A fresh directory under the system's temp dir, removed when dropped (even on panic).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let unique = format!(
            "tapejit-observability-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let dir = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ARCHITECTURE: [usize; 3] = [20, 9, 3];

/// Saves `p`'s params to `path` as a checkpoint of [`ARCHITECTURE`].
fn save(p: &dyn Program, path: &std::path::Path) {
    Checkpoint::of(p, &ARCHITECTURE).save(path).unwrap();
}

#[test]
fn checkpoints_move_params_between_the_jit_and_the_interpreter_bit_for_bit() {
    let dir = TempDir::new("roundtrip");
    let g = Graph::new();
    let classifier = Classifier::new(&g, 20, &[9], 3, &mut StdRng::seed_from_u64(8)).unwrap();
    let handles = params_in_creation_order(&classifier.model);
    let mut rng = StdRng::seed_from_u64(9);
    let samples: Vec<Vec<f64>> = (0..3).map(|_| classifier_sample(&mut rng, 20, 3)).collect();

    // JIT -> file -> interpreter.
    let mut jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    for s in &samples {
        jit.step(s, 0.2).unwrap();
    }
    let path = dir.0.join("from-jit.params");
    save(&jit, &path);
    let mut interp = Interpreter::new(&g).unwrap();
    interp
        .set_params(&Checkpoint::load_for(&path, &ARCHITECTURE, g.num_params()).unwrap())
        .unwrap();
    assert_eq!(bits(&interp.params()), bits(&jit.params()));
    for &h in &handles {
        assert_eq!(
            interp.value(h).unwrap().to_bits(),
            jit.value(h).unwrap().to_bits()
        );
    }

    // Interpreter (trained further) -> file -> a fresh JIT.
    for s in samples.iter().rev() {
        interp.step(s, 0.2).unwrap();
    }
    let path = dir.0.join("from-interpreter.params");
    save(&interp, &path);
    let mut fresh = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    fresh
        .set_params(&Checkpoint::load_for(&path, &ARCHITECTURE, g.num_params()).unwrap())
        .unwrap();
    assert_eq!(bits(&fresh.params()), bits(&interp.params()));
    for &h in &handles {
        assert_eq!(
            fresh.value(h).unwrap().to_bits(),
            interp.value(h).unwrap().to_bits()
        );
    }
    // Both programs now compute the same thing.
    for p in [&mut fresh as &mut dyn Program, &mut interp] {
        p.set_inputs(&samples[0]).unwrap();
        p.forward();
    }
    assert_eq!(bits(&fresh.outputs()), bits(&interp.outputs()));
}

#[test]
fn checkpoints_keep_signed_zeros_and_subnormals() {
    // Bit for bit means the awkward values too.
    let dir = TempDir::new("special");
    let g = Graph::new();
    Classifier::new(&g, 20, &[9], 3, &mut StdRng::seed_from_u64(10)).unwrap();
    let special = [
        -0.0,
        0.0,
        f64::MIN_POSITIVE,
        -f64::MIN_POSITIVE / 8.0,
        5e-324,
        f64::MAX,
        -1.0 / 3.0,
    ];
    let params: Vec<f64> = (0..g.num_params())
        .map(|k| special[k % special.len()])
        .collect();
    let mut jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    jit.set_params(&params).unwrap();
    let path = dir.0.join("special.params");
    save(&jit, &path);
    let mut interp = Interpreter::new(&g).unwrap();
    interp
        .set_params(&Checkpoint::load(&path).unwrap().params)
        .unwrap();
    assert_eq!(bits(&interp.params()), bits(&params));
    save(&interp, &path);
    let mut back = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    back.set_params(&Checkpoint::load(&path).unwrap().params)
        .unwrap();
    assert_eq!(bits(&back.params()), bits(&params));
}

// ---------------------------------------------------------------------------------------------
// 6. The loss `step` returns
// ---------------------------------------------------------------------------------------------

#[test]
fn step_returns_a_param_loss_before_its_update() {
    // The loss is a leaf: the update changes it, so `step` must read it first.
    let g = Graph::new();
    let p = g.param(3.0);
    g.set_loss(p).unwrap();
    for mut b in interpreter_and_every_jit_level(&g) {
        let first = b.program.step(&[], 0.1).unwrap();
        assert_eq!(first, 3.0, "{}", b.name);
        // d p / d p = 1, so the update is p -= 0.1.
        assert_eq!(b.program.params(), vec![3.0 - 0.1], "{}", b.name);
        assert_eq!(b.program.grad(p).unwrap(), 1.0, "{}", b.name);
        let second = b.program.step(&[], 0.1).unwrap();
        assert_eq!(second, 3.0 - 0.1, "{}", b.name);
    }
}

#[test]
fn step_returns_a_param_loss_that_the_layout_moved() {
    // The loss is one weight of a layer whose outputs are the graph's outputs, and only it
    // trains. Being the loss, it alone of its neuron's weights needs a gradient, which keeps
    // that neuron out of the layer's loops; but the neurons after it form a nest, whose
    // weights the layout puts first, so on the JIT the loss sits in another slot.
    let g = Graph::new();
    let layer = Layer::new(&g, 10, 10, Activation::Relu, &mut StdRng::seed_from_u64(12));
    let x = g.inputs_without_grad(10);
    for o in layer.call(&x).unwrap() {
        g.add_output(o).unwrap();
    }
    let weight = layer.neurons[2].w[5];
    g.set_loss(weight).unwrap();
    let inputs: Vec<f64> = (0..10).map(|i| 0.1 * i as f64 - 0.45).collect();
    let mut reference = Interpreter::new(&g).unwrap();
    let initial = reference.value(weight).unwrap();
    let before = reference.params();
    assert_eq!(reference.step(&inputs, 0.5).unwrap(), initial);
    let after = reference.params();
    let changed: Vec<usize> = (0..after.len())
        .filter(|&k| after[k] != before[k])
        .collect();
    assert_eq!(changed.len(), 1, "only the loss trains: {changed:?}");
    let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    let moved = jit.stats().moved_params > 0;
    for mut b in every_jit(&g) {
        // (Every program speaks the tape as built, where the layout pass moved the weight.)
        assert_eq!(b.program.tape().slot(weight), reference.tape().slot(weight));
        let loss = b.program.step(&inputs, 0.5).unwrap();
        assert_eq!(loss.to_bits(), initial.to_bits(), "{}", b.name);
        assert_eq!(bits(&b.program.params()), bits(&after), "{}", b.name);
        assert_eq!(
            bits(&b.program.outputs()),
            bits(&reference.outputs()),
            "{}",
            b.name
        );
        assert_eq!(b.program.grad(weight).unwrap(), 1.0, "{}", b.name);
    }
    assert!(moved, "no JIT moved the weight: the test lost its point");
}

#[test]
fn step_returns_an_input_loss_as_given() {
    let g = Graph::new();
    let x = g.input();
    let w = g.param(0.5);
    g.add_output(w * x).unwrap();
    g.set_loss(x).unwrap();
    for mut b in interpreter_and_every_jit_level(&g) {
        assert_eq!(b.program.step(&[2.5], 0.1).unwrap(), 2.5, "{}", b.name);
        assert_eq!(b.program.step(&[-1.0], 0.1).unwrap(), -1.0, "{}", b.name);
        // Nothing the loss depends on is a param.
        assert_eq!(b.program.params(), vec![0.5], "{}", b.name);
    }
}

#[test]
fn an_input_without_grad_that_is_the_loss_behaves_alike_everywhere() {
    // An edge the docs leave open: backward seeds the loss's gradient with 1 and "does not
    // compute" an input-without-grad's gradient. Whatever the answer, every backend must
    // give the same one, and `step` still returns the input as given.
    let g = Graph::new();
    let x = g.input_without_grad();
    let p = g.param(2.0);
    g.add_output(p * x).unwrap();
    g.set_loss(x).unwrap();
    let mut reference = Interpreter::new(&g).unwrap();
    assert_eq!(reference.step(&[1.5], 0.1).unwrap(), 1.5);
    for mut b in every_jit(&g) {
        assert_eq!(b.program.step(&[1.5], 0.1).unwrap(), 1.5, "{}", b.name);
        assert_eq!(
            read(b.program.as_ref(), x),
            read(&reference, x),
            "{}",
            b.name
        );
        assert_eq!(bits(&b.program.params()), bits(&[2.0]), "{}", b.name);
    }
}

#[test]
fn step_returns_a_computed_loss_before_the_update() {
    // `step` equals forward on the same inputs and params, and differs from forward after.
    let g = Graph::new();
    let d = dot(&g, 12);
    let inputs = dot_inputs(12);
    let mut probe = Interpreter::new(&g).unwrap();
    probe.set_inputs(&inputs).unwrap();
    let before = probe.forward();
    for mut b in interpreter_and_every_jit_level(&g) {
        let loss = b.program.step(&inputs, 0.5).unwrap();
        assert_eq!(loss.to_bits(), before.to_bits(), "{}", b.name);
        assert_eq!(b.program.value(d.loss).unwrap().to_bits(), before.to_bits());
        let after = b.program.forward();
        assert_ne!(after, before, "{}: the update changed nothing", b.name);
    }
}

#[test]
fn step_losses_agree_across_backends_over_several_steps() {
    // A tiny MLP with a computed loss, on the same samples everywhere.
    let g = Graph::new();
    let mlp = MLP::new(&g, 8, &[8, 1], &mut StdRng::seed_from_u64(13));
    let x = g.inputs_without_grad(8);
    let y = g.input_without_grad();
    let out = mlp.call(&x).unwrap();
    g.set_loss(nn::mse(&out, &[y]).unwrap()).unwrap();
    let mut rng = StdRng::seed_from_u64(14);
    let samples: Vec<Vec<f64>> = (0..5)
        .map(|_| (0..9).map(|_| rng.gen_range(-1.0..1.0)).collect())
        .collect();
    let mut reference = Interpreter::new(&g).unwrap();
    let expected: Vec<f64> = samples
        .iter()
        .map(|s| reference.step(s, 0.05).unwrap())
        .collect();
    for mut b in every_jit(&g) {
        let got: Vec<f64> = samples
            .iter()
            .map(|s| b.program.step(s, 0.05).unwrap())
            .collect();
        assert_eq!(bits(&got), bits(&expected), "{}", b.name);
        assert_eq!(
            bits(&b.program.params()),
            bits(&reference.params()),
            "{}",
            b.name
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Every public method after step and train
// ---------------------------------------------------------------------------------------------

/// One call of the public `Program` API; `Value`/`Grad` name a handle by index.
#[derive(Clone, Debug)]
enum Call {
    SetInputs(Vec<f64>),
    SetParams(Vec<f64>),
    ZeroGrad,
    Forward,
    Backward,
    Update(f64),
    Step(Vec<f64>, f64),
    Train(Vec<f64>, f64),
    Params,
    ParamGrads,
    Outputs,
    Loss,
    Value(usize),
    Grad(usize),
}

/// Performs `call`; returns the bits of what it returned, or its error as text (an error
/// carrying a NaN is not `==` to itself).
fn perform(p: &mut dyn Program, call: &Call, handles: &[Value<'_>]) -> Result<Vec<u64>, String> {
    let bits_of = |x: f64| vec![x.to_bits()];
    let result = match call {
        Call::SetInputs(x) => p.set_inputs(x).map(|_| vec![]),
        Call::SetParams(x) => p.set_params(x).map(|_| vec![]),
        Call::ZeroGrad => {
            p.zero_grad();
            Ok(vec![])
        }
        Call::Forward => Ok(bits_of(p.forward())),
        Call::Backward => p.backward().map(|_| vec![]),
        Call::Update(lr) => p.update(*lr).map(|_| vec![]),
        Call::Step(x, lr) => p.step(x, *lr).map(bits_of),
        Call::Train(x, lr) => p.train(x, *lr).map(|losses| bits(&losses)),
        Call::Params => Ok(bits(&p.params())),
        Call::ParamGrads => Ok(bits(&p.param_grads())),
        Call::Outputs => Ok(bits(&p.outputs())),
        Call::Loss => p.loss().map(bits_of),
        Call::Value(k) => p.value(handles[*k]).map(bits_of),
        Call::Grad(k) => p.grad(handles[*k]).map(bits_of),
    };
    result.map_err(|e| format!("{e:?}"))
}

/// Everything observable after a sequence: params and their gradients in creation order,
/// outputs, loss, and every non-param slot's value and gradient (`None` where `p` does not
/// keep it).
type Observed = (
    Vec<u64>,
    Vec<u64>,
    Vec<u64>,
    Option<u64>,
    Vec<Option<(u64, u64)>>,
);

/// What each call of a sequence returned, and what was observable after it.
type Outcome = (Vec<Result<Vec<u64>, String>>, Observed);

fn observe(p: &dyn Program) -> Observed {
    let slots = (p.tape().num_params()..p.tape().len())
        .map(|s| {
            p.is_kept(Slot(s as u32))
                .then(|| (p.values()[s].to_bits(), p.grads()[s].to_bits()))
        })
        .collect();
    (
        bits(&p.params()),
        bits(&p.param_grads()),
        bits(&p.outputs()),
        p.loss().ok().map(f64::to_bits),
        slots,
    )
}

/// `step` and `train` may leave the JIT's gradients of fused products unstored (a 16-24-4
/// classifier defers 220 of its 508 param gradients). No sequence of public calls may lose
/// them or read them stale: after each of `step` and `train`, every pair of public calls
/// (failing ones included) returns the interpreter's bits, and then every observable number
/// is the interpreter's. Nothing is observed between the calls of a sequence, so each call
/// meets the deferred state.
#[test]
fn every_public_method_after_step_or_train_matches_the_interpreter() {
    let g = Graph::new();
    let classifier = Classifier::new(&g, 16, &[24], 4, &mut StdRng::seed_from_u64(20)).unwrap();
    let (nin, classes) = (16, 4);
    let mut rng = StdRng::seed_from_u64(21);
    let mut sample = || classifier_sample(&mut rng, nin, classes);
    let weight = classifier.model.layers[0].neurons[0].w[0];
    let handles = [weight, classifier.logits[1], classifier.loss];
    let new_params: Vec<f64> = (0..g.num_params())
        .map(|k| 0.01 * (k % 13) as f64 - 0.06)
        .collect();
    let mut bad = sample();
    bad[3] = f64::NAN;
    let mut followers = vec![
        Call::SetInputs(sample()),
        Call::SetParams(new_params),
        Call::ZeroGrad,
        Call::Forward,
        Call::Backward,
        Call::Update(0.01),
        Call::Update(f64::NAN),
        Call::Step(sample(), 0.01),
        Call::Step(bad.clone(), 0.01),
        Call::Train([sample(), sample()].concat(), 0.01),
        Call::Train(bad[1..].to_vec(), 0.01),
        Call::Params,
        Call::ParamGrads,
        Call::Outputs,
        Call::Loss,
    ];
    followers.extend((0..handles.len()).flat_map(|k| [Call::Value(k), Call::Grad(k)]));
    let firsts = [
        Call::Step(sample(), 0.01),
        Call::Train([sample(), sample(), sample()].concat(), 0.01),
    ];
    let mut sequences = Vec::new();
    for first in &firsts {
        for a in &followers {
            for b in &followers {
                sequences.push([first.clone(), a.clone(), b.clone()]);
            }
        }
    }

    // Each backend runs all sequences one after the other, observed after each.
    let run = |p: &mut dyn Program| -> Vec<Outcome> {
        sequences
            .iter()
            .map(|calls| {
                let results = calls.iter().map(|c| perform(p, c, &handles)).collect();
                (results, observe(p))
            })
            .collect()
    };
    let mut reference = Interpreter::new(&g).unwrap();
    let expected = run(&mut reference);
    for mut b in every_jit(&g) {
        let got = run(b.program.as_mut());
        for (k, (calls, (want, have))) in
            sequences.iter().zip(expected.iter().zip(&got)).enumerate()
        {
            let at = format!("{}, sequence {k} {calls:?}", b.name);
            assert_eq!(have.0, want.0, "{at}: call results");
            let (want, have) = (&want.1, &have.1);
            assert_eq!(have.0, want.0, "{at}: params");
            assert_eq!(have.1, want.1, "{at}: param_grads");
            assert_eq!(have.2, want.2, "{at}: outputs");
            assert_eq!(have.3, want.3, "{at}: loss");
            for (s, (h, w)) in have.4.iter().zip(&want.4).enumerate() {
                if let Some(h) = h {
                    assert_eq!(
                        Some(h),
                        w.as_ref(),
                        "{at}: non-param slot {s} (value, grad)"
                    );
                }
            }
        }
    }
}
