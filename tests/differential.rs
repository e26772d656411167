//! Differential tests: the JIT at every optimization level must reproduce the interpreter bit
//! for bit, on 500 seeded random graphs and on hand-picked edge cases.
//!
//! Each graph is built once and compiled at all four levels, then every backend runs the same
//! training script (see `common::training_script`) and is compared after every call.

mod common;

use std::collections::BTreeSet;
use std::ops::Range;

use common::{
    assert_backends_agree, assert_backends_agree_on, build_random_graph, interpreter,
    interpreter_and_every_jit_level, training_script, Action, Backend, Generated, GraphShape,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use strum::IntoEnumIterator;
use tapejit::{Error, Graph, Jit, Op, OptLevel, Program, Tape, Value};

/// The seeds of the differential suite and the graph sizes they get: mostly small graphs
/// (compilation dominates the run time), some medium ones, and a few big ones.
const SMALL_SEEDS: Range<u64> = 0..300;
const MEDIUM_SEEDS: Range<u64> = 300..494;
const LARGE_SEEDS: Range<u64> = 494..500;
const ALL_SEEDS: Range<u64> = 0..500;

fn nodes_for_seed(seed: u64) -> std::ops::RangeInclusive<usize> {
    if SMALL_SEEDS.contains(&seed) {
        10..=100
    } else if MEDIUM_SEEDS.contains(&seed) {
        100..=300
    } else {
        1800..=2200
    }
}

/// Builds the graph of `seed` into `graph`; returns it and the rng to draw the script from.
fn graph_for_seed(graph: &Graph, seed: u64) -> (Generated<'_>, StdRng) {
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = GraphShape::random(&mut rng, nodes_for_seed(seed));
    (build_random_graph(graph, &mut rng, shape), rng)
}

fn check_seeds_on_every_level(seeds: Range<u64>) {
    for seed in seeds {
        let graph = Graph::new();
        let (_, mut rng) = graph_for_seed(&graph, seed);
        let mut backends = interpreter_and_every_jit_level(&graph);
        let context = format!("seed {seed} ({} nodes)", graph.len());
        assert_backends_agree(&context, &mut backends, &mut rng);
    }
}

// Several test functions rather than one loop, so the harness spreads them over the cores.

#[test]
fn jit_matches_interpreter_on_small_graphs_first_half() {
    check_seeds_on_every_level(SMALL_SEEDS.start..150);
}

#[test]
fn jit_matches_interpreter_on_small_graphs_second_half() {
    check_seeds_on_every_level(150..SMALL_SEEDS.end);
}

#[test]
fn jit_matches_interpreter_on_medium_graphs_first_half() {
    check_seeds_on_every_level(MEDIUM_SEEDS.start..397);
}

#[test]
fn jit_matches_interpreter_on_medium_graphs_second_half() {
    check_seeds_on_every_level(397..MEDIUM_SEEDS.end);
}

#[test]
fn jit_matches_interpreter_on_large_graphs() {
    check_seeds_on_every_level(LARGE_SEEDS);
}

/// The JIT splits big tapes into several native functions; tiny chunks put a function
/// boundary between almost every producer and its users.
#[test]
fn jit_matches_interpreter_whatever_the_chunk_size() {
    for seed in (MEDIUM_SEEDS.start..MEDIUM_SEEDS.end).step_by(19) {
        let graph = Graph::new();
        let (_, mut rng) = graph_for_seed(&graph, seed);
        let mut backends = vec![interpreter(&graph)];
        for chunk_size in [1, 7, 64] {
            for level in [OptLevel::O0, OptLevel::O2] {
                let jit = Jit::builder()
                    .opt_level(level)
                    .chunk_size(chunk_size)
                    .compile(&graph)
                    .unwrap();
                backends.push(Backend {
                    name: format!("jit {level:?}, chunks of {chunk_size}"),
                    program: Box::new(jit),
                });
            }
        }
        assert_backends_agree(&format!("seed {seed}"), &mut backends, &mut rng);
    }
}

// ---------------------------------------------------------------------------------------------
// The generator itself: checked on the interpreter alone, so these hold without the JIT.
// ---------------------------------------------------------------------------------------------

/// The same seed must give the same graph and the same numbers, or a failing seed could not
/// be replayed. Two interpreters side by side also exercise the comparison helper.
#[test]
fn generator_is_deterministic() {
    for seed in [0, 1, 299, 300, 493, 499] {
        let (first, second) = (Graph::new(), Graph::new());
        let (_, mut rng) = graph_for_seed(&first, seed);
        graph_for_seed(&second, seed);
        let (a, b) = (
            Tape::from_graph(&first).unwrap(),
            Tape::from_graph(&second).unwrap(),
        );
        assert_eq!(a.len(), b.len(), "seed {seed}");
        for s in a.slots() {
            assert_eq!(a.node(s), b.node(s), "seed {seed}, slot {s:?}");
        }
        let mut backends = [interpreter(&first), interpreter(&second)];
        backends[1].name = "second interpreter".into();
        assert_backends_agree(&format!("seed {seed}"), &mut backends, &mut rng);
    }
}

/// The comparison must notice the smallest difference: one ulp in one param.
#[test]
#[should_panic(expected = "params differ at #0")]
fn comparison_catches_a_one_ulp_difference() {
    let build = |g: &Graph, init: f64| {
        let p = g.param(init);
        g.set_loss((p * 3.0).tanh()).unwrap();
    };
    let (exact, off_by_one_ulp) = (Graph::new(), Graph::new());
    build(&exact, 0.5);
    build(&off_by_one_ulp, f64::from_bits(0.5f64.to_bits() + 1));
    let mut backends = [interpreter(&exact), interpreter(&off_by_one_ulp)];
    let forward_only = [Action::Forward];
    assert_backends_agree_on("one ulp", &mut backends, &forward_only);
}

/// Bit-identical NaNs would prove little (and NaN payloads may legitimately differ), so the
/// generator must keep every value and gradient finite through the whole script; and the
/// suite is only as good as its coverage of ops and of dead code.
#[test]
fn generated_graphs_stay_finite_and_cover_every_op() {
    let mut ops_seen = BTreeSet::new();
    let mut graphs_with_dead_code = 0;
    for seed in ALL_SEEDS {
        let graph = Graph::new();
        let (generated, mut rng) = graph_for_seed(&graph, seed);
        let mut program = interpreter(&graph).program;
        let tape = program.tape().clone();
        let script = training_script(&mut rng, tape.num_inputs(), tape.num_params());
        for action in &script {
            common::apply(program.as_mut(), action).unwrap();
            assert_all_finite(&format!("seed {seed}, after {action:?}"), program.as_ref());
        }

        let ops: BTreeSet<&str> = tape
            .slots()
            .map(|s| tape.node(s).unwrap().op.name())
            .collect();
        // Ops are dealt a deck at a time, each with its operands and squashing around it: a
        // graph of 7 nodes per op holds a whole deck (the largest lacking one has 5 per op).
        if graph.len() >= 7 * every_op().len() {
            assert_eq!(
                ops.len(),
                every_op().len(),
                "seed {seed} lacks some ops: {ops:?}"
            );
        }
        ops_seen.extend(ops);

        for &v in &generated.dead {
            assert_eq!(
                tape.slot(v),
                Err(Error::NotOnTape { node: v.id() }),
                "seed {seed}: {v:?} should be dead"
            );
        }
        if !generated.dead.is_empty() {
            assert!(tape.len() < graph.len(), "seed {seed}: dead code was kept");
            graphs_with_dead_code += 1;
        }
        for v in generated.outputs.iter().chain([&generated.loss]) {
            assert!(
                tape.slot(*v).is_ok(),
                "seed {seed}: {v:?} should be on the tape"
            );
        }
    }
    assert_eq!(ops_seen, every_op());
    assert!(
        graphs_with_dead_code >= 50,
        "only {graphs_with_dead_code} graphs have dead code"
    );
}

/// Every op's name, from `Op::iter()`: a new op is expected in the graphs unedited.
fn every_op() -> BTreeSet<&'static str> {
    Op::iter().map(Op::name).collect()
}

fn assert_all_finite(context: &str, program: &dyn Program) {
    for (what, buffer) in [("value", program.values()), ("grad", program.grads())] {
        if let Some(slot) = buffer.iter().position(|x| !x.is_finite()) {
            panic!(
                "{context}: {what} of slot {slot} ({}) is {}",
                program
                    .tape()
                    .node(tapejit::Slot(slot as u32))
                    .unwrap()
                    .op
                    .name(),
                buffer[slot]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Edge cases a random generator is unlikely to hit.
// ---------------------------------------------------------------------------------------------

/// Builds an edge-case graph into an empty graph.
type EdgeCase = (&'static str, fn(&Graph));

const EDGE_CASES: &[EdgeCase] = &[
    ("only constants, no params or inputs", |g| {
        let c = g.constant(1.5) * 2.0 - 0.25;
        g.add_output(c).unwrap();
        g.set_loss(c.tanh()).unwrap();
    }),
    ("the loss is a param", |g| {
        let p = g.param(0.75);
        g.add_output(p * 2.0).unwrap();
        g.set_loss(p).unwrap();
    }),
    ("the loss is an input", |g| {
        let x = g.input();
        let p = g.param(0.5);
        g.add_output(p * x).unwrap();
        g.set_loss(x).unwrap();
    }),
    ("the loss is a constant", |g| {
        let p = g.param(0.5);
        g.add_output(p.exp()).unwrap();
        g.set_loss(g.constant(3.0)).unwrap();
    }),
    ("no loss: forward only", |g| {
        let x = g.input();
        let p = g.param(0.5);
        g.add_output((p * x).tanh()).unwrap();
        g.add_output(x).unwrap();
    }),
    ("no outputs and no loss", |g| {
        let x = g.input();
        let p = g.param(0.5);
        let _unused = p * x;
    }),
    ("an empty graph", |_| {}),
    ("unused params and inputs", |g| {
        let _ = g.inputs(3);
        let p = g.param(0.25);
        let _ = g.param(-4.0);
        g.set_loss(p * p).unwrap();
    }),
    ("sums of one operand and of a repeated operand", |g| {
        let x = g.input();
        let p = g.param(1.25);
        let one = g.sum(&[p]);
        let repeated = g.sum(&[p, x, p, p, one]);
        g.add_output(one).unwrap();
        g.set_loss(repeated * repeated).unwrap();
    }),
    ("the empty sum is the constant 0", |g| {
        let p = g.param(2.0);
        let zero = g.sum(&[]);
        g.set_loss(p * zero + p).unwrap();
    }),
    (
        "relu at exactly +0 and -0, and powers with special exponents",
        |g| {
            let x = g.input();
            let p = g.param(1.5);
            let zero = p + -p; // exactly +0.0
            let minus_zero = -zero;
            let relus = g.sum(&[zero.relu(), minus_zero.relu(), (x * 0.0).relu()]);
            // Positive whatever p is, so the fractional powers stay real.
            let q = p * p + 0.5;
            let powers = g.sum(&[
                q.powf(0.0),
                q.powf(1.0),
                q.powf(2.0),
                q.powf(0.5),
                q.powf(-1.0),
                q.powf(-0.5),
                zero.powf(2.0),
                zero.powf(1.0),
            ]);
            g.add_output(minus_zero.relu()).unwrap();
            g.set_loss(relus * p + powers).unwrap();
        },
    ),
    ("one value is every output and the loss", |g| {
        let x = g.input();
        let p = g.param(-0.5);
        let y = (p * x).sigmoid();
        for _ in 0..3 {
            g.add_output(y).unwrap();
        }
        g.set_loss(y).unwrap();
    }),
    ("a long chain of one op", |g| {
        let p = g.param(0.3);
        let mut y = p;
        for _ in 0..500 {
            y = (y * 1.01).tanh();
        }
        g.set_loss(y).unwrap();
    }),
    // (Not sqrt at 0: its derivative is infinite there. tests/loops.rs compares it, NaNs
    // and infinities included.)
    ("the newer ops far out and at zeros", |g| {
        let x = g.input();
        let p = g.param(0.75);
        let big = (x + p + 3.0) * 1e22;
        let huge = g.constant(1e300) * p;
        let zero = p + -p; // exactly +0.0
                           // Scaled back, so the gradients stay small and the params finite.
        let terms = [
            big.sin() * 1e-22,
            big.cos() * 1e-22,
            huge.sin() * 1e-300,
            huge.cos() * 1e-300,
            g.constant(1e22).sin() * p,
            (x * 1000.0).softplus(),
            (x * -1000.0).softplus(),
            (p * 40.0).softplus(),
            (x * p).abs(),
            (-zero).abs() * p,
            ((x * p).abs() + 1.0).sqrt(),
            (x * p).abs().log1p(),
            (x * 1e-20).log1p(),
            x.min(p) + x.max(p),
            zero.min(-zero) * p + (-zero).max(zero) * p,
        ];
        g.add_output(big.sin()).unwrap();
        g.set_loss(g.sum(&terms)).unwrap();
    }),
    ("a wide sum of many shared subexpressions", |g| {
        let x = g.input();
        let p = g.param(0.1);
        let square = p * x * (p * x);
        let terms: Vec<Value> = (0..300).map(|i| square * (i as f64 * 0.01)).collect();
        g.set_loss(g.sum(&terms)).unwrap();
    }),
];

#[test]
fn jit_matches_interpreter_on_edge_cases() {
    for (name, build) in EDGE_CASES {
        let graph = Graph::new();
        build(&graph);
        let mut backends = interpreter_and_every_jit_level(&graph);
        let (num_inputs, num_params) = (graph.num_inputs(), graph.num_params());
        let mut rng = StdRng::seed_from_u64(7);
        let mut script = training_script(&mut rng, num_inputs, num_params);
        // Exact zeros as inputs, -0.0 included: relu and multiplication must keep the sign
        // micrograd's formulas give.
        script.insert(1, Action::SetInputs(vec![-0.0; num_inputs]));
        script.insert(2, Action::Forward);
        // Without a loss, backward and step fail alike on every backend; the comparison
        // covers that too.
        assert_backends_agree_on(name, &mut backends, &script);
        // NaNs would make the comparison meaningless (see assert_all_finite).
        assert_all_finite(&format!("{name}, at the end"), backends[0].program.as_ref());
    }
}
