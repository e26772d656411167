//! The kernel-tier prototype (benches/common/tier1.rs) computes the reference interpreter's
//! very bits in each of its schedules: values, gradients and params after a few steps, and
//! the losses, on the report's graphs (random DAGs, issue #40's irregular graph), the graph
//! families, and seeded random graphs of every op with outputs beside the loss, inputs
//! without gradients and special inputs (signed zeros, huge and tiny numbers: infinities and
//! NaNs inside). Backward called twice without `zero_grad` accumulates params' gradients as
//! the interpreter's does.

mod common;
#[path = "../benches/common/families.rs"]
mod families;
#[path = "../benches/common/tier1.rs"]
mod tier1;
#[path = "../benches/common/workload.rs"]
mod workload;

use common::{build_random_graph, random_inputs, GraphShape, LEARNING_RATE};
use families::{Family, Minibatch, Moons, Rnn, Springs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::{Graph, Interpreter, Program, Tape};
use tier1::{Schedule, Tier1};

/// Steps every comparison takes.
const STEPS: usize = 3;

/// The same bits, or both NaN (which NaN payload an operation of two NaNs keeps is the
/// compiler's pick, as for the yardstick's test).
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Panics at the first slot where `got` and `want` differ.
fn first_diff(at: &str, interp: &Interpreter, what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{at}: {what}s' count");
    if let Some(s) = (0..want.len()).find(|&s| !same(got[s], want[s])) {
        let op = interp.tape().node(tapejit::Slot(s as u32)).map(|n| n.op);
        panic!(
            "{at}: {what} of slot {s} ({op:?}): {} vs the interpreter's {}",
            got[s], want[s]
        );
    }
}

/// `STEPS` steps on `inputs` at `lr` on the interpreter and the tier in every schedule,
/// compared after each: the loss, every value and gradient by slot, and the params. Then a
/// forward and two backwards without zeroing: the params' gradients accumulate alike.
fn assert_same_bits(context: &str, g: &Graph, inputs: &[f64], lr: f64) {
    let tape = Tape::from_graph(g).expect("a graph that linearizes");
    for schedule in Schedule::ALL {
        let mut interp = Interpreter::new(g).expect("a graph the interpreter runs");
        let mut tier = Tier1::from_tape(&tape, schedule);
        let context = format!("{context}, {}", schedule.name());
        assert_eq!(tier.len(), interp.tape().len(), "{context}: one per slot");
        for step in 1..=STEPS {
            let want = interp.step(inputs, lr).expect("the graph's inputs");
            let got = tier.step(inputs, lr);
            let at = format!("{context}, step {step}");
            assert!(same(got, want), "{at}: loss {got} vs {want}");
            first_diff(
                &at,
                &interp,
                "value",
                &tier.values_by_slot(),
                interp.values(),
            );
            first_diff(
                &at,
                &interp,
                "gradient",
                &tier.grads_by_slot(),
                interp.grads(),
            );
            first_diff(&at, &interp, "param", &tier.params(), &interp.params());
        }
        interp.forward();
        tier.forward();
        for _ in 0..2 {
            interp.backward().expect("a loss");
            tier.backward();
        }
        let at = format!("{context}, accumulated");
        first_diff(
            &at,
            &interp,
            "gradient",
            &tier.grads_by_slot(),
            interp.grads(),
        );
    }
}

#[test]
fn matches_the_interpreter_on_random_dags() {
    for (nodes, seed) in [(200, 1), (3_000, 2)] {
        let g = Graph::new();
        workload::random_dag(&g, nodes, seed);
        let mut rng = StdRng::seed_from_u64(seed);
        let inputs: Vec<f64> = (0..g.num_inputs())
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        assert_same_bits(&format!("random_dag({nodes}, {seed})"), &g, &inputs, 0.01);
    }
}

#[test]
fn matches_the_interpreter_on_irregular_graphs() {
    for (ops, seed) in [(50, 1), (1_000, 2)] {
        let g = Graph::new();
        workload::irregular_ops(&g, ops, seed);
        let mut rng = StdRng::seed_from_u64(seed);
        let inputs: Vec<f64> = (0..g.num_inputs())
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        assert_same_bits(&format!("irregular_ops({ops}, {seed})"), &g, &inputs, 0.01);
    }
}

/// Moons reads inputs without gradients and shows outputs the loss does not read; springs
/// takes powers and square roots; minibatch and RNN are copies and recurrences.
#[test]
fn matches_the_interpreter_on_the_families() {
    let families = [
        Family::Moons(Moons {
            points: 8,
            layers: vec![4, 4, 1],
            ..Moons::demo()
        }),
        Family::Minibatch(Minibatch {
            nin: 12,
            hidden: 6,
            classes: 3,
            seed: 0,
            samples: Minibatch::synthetic_samples(12, 3, 4, 1),
        }),
        Family::Rnn(Rnn {
            inputs: 3,
            hidden: 5,
            ..Rnn::new(6)
        }),
        Family::Springs(Springs {
            masses: 4,
            ..Springs::new(5)
        }),
    ];
    for family in &families {
        let g = Graph::new();
        let built = family.build(&g);
        let context = format!("{} {}", family.kind(), family.size());
        assert_same_bits(&context, &g, &built.inputs, built.lr);
    }
}

/// Every op, in and out of its domain: random graphs of `Op::iter()` (outputs beside the
/// loss, dead ends), on inputs in range and on special ones.
#[test]
fn matches_the_interpreter_on_random_graphs_of_every_op() {
    let special = [0.0, -0.0, 1e300, -1e300, 710.0, -750.0, 5e-324, -3.0];
    for seed in 0..120 {
        let mut rng = StdRng::seed_from_u64(seed);
        let g = Graph::new();
        let shape = GraphShape::random(&mut rng, 10..=150);
        build_random_graph(&g, &mut rng, shape);
        let mut inputs = random_inputs(&mut rng, g.num_inputs());
        assert_same_bits(&format!("seed {seed}"), &g, &inputs, LEARNING_RATE);
        for x in &mut inputs {
            if rng.gen_bool(0.5) {
                *x = special[rng.gen_range(0..special.len())];
            }
        }
        assert_same_bits(&format!("seed {seed}, special inputs"), &g, &inputs, 0.5);
    }
}

/// An input made without a gradient keeps a zero gradient, a graph whose loss is a leaf
/// steps as the interpreter does, and a value read twice by one operation (or by several
/// that a schedule reorders) gets its contributions in the interpreter's order.
#[test]
fn matches_the_interpreter_at_the_edges() {
    let g = Graph::new();
    let x = g.input_without_grad();
    let w = g.param(0.5);
    let y = (x * w).tanh() + x.exp();
    g.add_output(y * 3.0).unwrap();
    g.set_loss(y * y).unwrap();
    assert_same_bits("input without gradient", &g, &[0.7], 0.1);

    let g = Graph::new();
    let p = g.param(2.0);
    g.input();
    g.set_loss(p).unwrap();
    assert_same_bits("a param as the loss", &g, &[1.0], 0.1);

    // Many consumers of one value, of alternating kinds, so that every schedule but the
    // tape's reorders them; values chosen so the order of addition shows in the bits.
    let g = Graph::new();
    let a = g.param(0.3);
    let b = g.input();
    let mut terms = Vec::new();
    for i in 0..40 {
        let t = match i % 4 {
            0 => (a * b).tanh(),
            1 => a.exp() * (i as f64 * 1.37),
            2 => a * a,
            _ => (a + b).sigmoid() * 1e-9,
        };
        terms.push(t);
    }
    g.set_loss(g.sum(&terms)).unwrap();
    assert_same_bits("a value of many consumers", &g, &[0.9], 0.1);
}
