//! Structure recovery (issue #10): graphs that repeat themselves at every scale, run bit for
//! bit against the interpreter at O0-O3 with recovery on and off, and the structure recovery
//! finds, asserted through `JitStats::nests` wherever it is well defined.
//!
//! 1. The families: moons (one nest over the 100 copies of the MLP), minibatch as B copies
//!    (one nest over B), an Elman RNN and a mass-spring rollout (a nest over the steps).
//!    A ring of particles integrated by Verlet, whose steps have no inner repetition; an
//!    n-body rollout, whose bodies' pairs skip themselves.
//! 2. Boundaries: a first or last copy that differs, a copy that reads a neighbour's value,
//!    copies with params of their own (in either order; an ensemble), a stride that changes
//!    midway, a block interrupted by an unrelated node, copies that differ only in which
//!    values take a gradient (inputs with and without, copies outside the loss's cone,
//!    params and inputs side by side in slot order) or in a constant.
//! 3. Depth: copies of steps of neurons (depth 3), a structure deeper than the deepest nest,
//!    and repetitions too small to nest.
//!
//! Every check also compiles at O0 in functions of a few nodes (nests cut across functions)
//! and runs `train`. Structure recovery should find but does not, in ignored tests: 3 or 4
//! copies, every alike step of the springs, the steps of a ring of 4.
//!
//! Every graph stays at a few thousand nodes: compiling straight-line at O1-O3 is what the
//! file spends its time on.

mod common;

#[path = "../benches/common/families.rs"]
mod families;
#[path = "../benches/common/workload.rs"]
mod workload;

use common::{assert_backends_agree, interpreter, random_inputs, Backend, LEARNING_RATE};
use families::{Minibatch, Moons, Rnn, Springs};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tapejit::nn::{self, Activation, Layer, Neuron};
use tapejit::{Graph, Jit, JitStats, NestStats, OptLevel, Tiering, Value};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Compiles `g` at every level with recovery on and, if `straight`, off (and at O0 in
/// functions of a few nodes, so nests are cut across functions); runs the training script on
/// every backend against the interpreter, bit for bit after every call, then `train` on 3
/// samples; returns the statistics of recovery (the same at every level, which this checks).
fn check_with(name: &str, g: &Graph, straight: bool) -> JitStats {
    let mut backends = vec![interpreter(g)];
    let mut stats: Option<JitStats> = None;
    let lowerings: &[bool] = if straight { &[true, false] } else { &[true] };
    let configs = lowerings
        .iter()
        .flat_map(|&recovery| OptLevel::ALL.map(|level| (level, recovery, None)))
        .chain([(OptLevel::O0, true, Some(SMALL_CHUNK))]);
    for (level, recovery, chunk) in configs {
        let mut builder = Jit::builder()
            .tiering(Tiering::Off)
            .opt_level(level)
            .loop_recovery(recovery);
        if let Some(nodes) = chunk {
            builder = builder.chunk_size(nodes);
        }
        let jit = builder
            .compile(g)
            .unwrap_or_else(|e| panic!("{name}: JIT at {level} rejected the graph: {e}"));
        let nests = &jit.stats().nests;
        match (&stats, recovery) {
            (None, true) => stats = Some(jit.stats().clone()),
            (Some(first), true) => assert_eq!(
                outline(&first.nests),
                outline(nests),
                "{name}: the structure differs at {level}, chunks of {chunk:?}"
            ),
            (_, false) => assert!(nests.is_empty(), "{name}: nests with recovery off"),
        }
        let lowering = if recovery { "loops" } else { "straight" };
        let chunk = chunk.map_or(String::new(), |n| format!(" in chunks of {n}"));
        backends.push(Backend {
            name: format!("jit {level:?} {lowering}{chunk}"),
            program: Box::new(jit),
        });
    }
    let mut rng = StdRng::seed_from_u64(10);
    assert_backends_agree(name, &mut backends, &mut rng);
    assert_train_agrees(name, &mut backends, &mut rng);
    stats.expect("at least one level")
}

/// A chunk size that cuts every nest of the tests across functions.
const SMALL_CHUNK: usize = 12;

/// `train` on 3 samples: the same losses, params and param gradients on every backend.
fn assert_train_agrees(name: &str, backends: &mut [Backend], rng: &mut StdRng) {
    let width = backends[0].program.tape().num_inputs();
    let samples = random_inputs(rng, 3 * width);
    let bits = |xs: &[f64]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (reference, others) = backends.split_first_mut().expect("no backends");
    let want = reference.program.train(&samples, LEARNING_RATE).unwrap();
    for other in others {
        let got = other.program.train(&samples, LEARNING_RATE).unwrap();
        let at = format!("{name}: train on {}", other.name);
        assert_eq!(bits(&got), bits(&want), "{at}: losses");
        let (p, r) = (other.program.as_ref(), reference.program.as_ref());
        assert_eq!(bits(&p.params()), bits(&r.params()), "{at}: params");
        assert_eq!(
            bits(&p.param_grads()),
            bits(&r.param_grads()),
            "{at}: param gradients"
        );
    }
}

/// [`check_with`] with recovery on and off: the differential style.
fn check(name: &str, g: &Graph) -> JitStats {
    check_with(name, g, true)
}

/// The nests in a line, for assertions and failure messages: `count x nodes`, a `~` where
/// forward runs in lanes, inner nests in brackets: `100x36900[16x64~ 16x288~] 100x400~`.
fn outline(nests: &[NestStats]) -> String {
    let one = |n: &NestStats| {
        let lanes = if n.lanes { "~" } else { "" };
        let inner = if n.inner.is_empty() {
            String::new()
        } else {
            format!("[{}]", outline(&n.inner))
        };
        format!("{}x{}{lanes}{inner}", n.count, n.nodes)
    };
    nests.iter().map(one).collect::<Vec<_>>().join(" ")
}

/// How deep `nest` nests (1: no nest inside).
/// The nodes of each top-level nest of `count` repetitions, in tape order.
fn top_nest_nodes(stats: &JitStats, count: u32) -> Vec<usize> {
    stats
        .nests
        .iter()
        .filter(|n| n.count == count)
        .map(|n| n.nodes)
        .collect()
}

fn depth(nest: &NestStats) -> usize {
    1 + nest.inner.iter().map(depth).max().unwrap_or(0)
}

/// The outermost nests whose repetitions are whole copies of `per_copy` nodes.
fn copy_nests(stats: &JitStats, per_copy: usize) -> Vec<&NestStats> {
    stats
        .nests
        .iter()
        .filter(|n| n.nodes == n.count as usize * per_copy)
        .collect()
}

/// Non-leaf nodes `build` adds to `g` (leaves, made beforehand, are not counted).
fn nodes_of<T>(g: &Graph, build: impl FnOnce() -> T) -> (T, usize) {
    let before = g.len();
    let out = build();
    (out, g.len() - before)
}

/// The params copies share: a layer of 6 tanh neurons over [`BODY_IN`] inputs (each 4
/// products, their sum, a tanh: the layer is a nest of 6 repetitions, 36 nodes) and a linear
/// readout (6 products and a sum): [`BODY_NODES`] nodes a copy.
struct Body<'g> {
    layer: Layer<'g>,
    readout: Neuron<'g>,
}

const BODY_IN: usize = 4;
const BODY_NODES: usize = 43;
const BODY_LAYER: &str = "6x36~";

impl<'g> Body<'g> {
    fn new(g: &'g Graph, seed: u64) -> Body<'g> {
        let mut rng = StdRng::seed_from_u64(seed);
        Body {
            layer: Layer::new(g, BODY_IN, 6, Activation::Tanh, &mut rng),
            readout: Neuron::new(g, 6, Activation::Linear, &mut rng),
        }
    }

    fn call(&self, x: &[Value<'g>]) -> Value<'g> {
        let h = self.layer.call(x).expect("BODY_IN inputs");
        self.readout.call(&h).expect("six hidden values")
    }
}

/// The loss over the copies' outputs: their mean squared error against `targets`.
fn set_mse<'g>(g: &'g Graph, outs: &[Value<'g>], targets: &[Value<'g>]) {
    g.set_loss(nn::mse(outs, targets).expect("one target per copy"))
        .expect("one graph");
}

// ---------------------------------------------------------------------------------------------
// 1. The families
// ---------------------------------------------------------------------------------------------

/// Nodes of one copy of micrograd's `MLP(2, [16, 16, 1])`: 16 neurons of 2 products, a sum
/// and a relu; 16 of 16 products, a sum and a relu; one of 16 products and a sum.
const MOONS_MLP_NODES: usize = 16 * 4 + 16 * 18 + 17;

#[test]
fn moons_demo_is_one_nest_over_its_100_copies() {
    // The demo itself, recovery on only (straight-line it compiles for seconds per level).
    let g = Graph::new();
    Moons::demo().build(&g);
    let stats = check_with("moons demo", &g, false);
    let copies = copy_nests(&stats, MOONS_MLP_NODES);
    assert_eq!(
        copies.len(),
        1,
        "one nest over the copies: {}",
        outline(&stats.nests)
    );
    // The copies, each with its two hidden layers as nests of 16 neurons; after them the
    // loss's 100 terms `relu(1 + -y * score)` (4 nodes each, built once every score is),
    // the only other nest of 100.
    let nest = copies[0];
    assert_eq!(nest.count, 100, "{}", outline(&stats.nests));
    assert_eq!(
        outline(&nest.inner),
        "16x64~ 16x288~",
        "{}",
        outline(&stats.nests)
    );
    assert_eq!(
        top_nest_nodes(&stats, 100),
        [100 * MOONS_MLP_NODES, 100 * 4],
        "{}",
        outline(&stats.nests)
    );
    // The L2 term `sum(p * p for p in params)` reads the params in creation order, neuron by
    // neuron, where the layout pass moved each layer's weights input-major: its products read
    // a layer's rows transposed, which repeat row after row, a nest of 16 neurons' weights and
    // bias per hidden layer (the output neuron's stay in order).
    assert_eq!(
        top_nest_nodes(&stats, 16),
        [16 * 3, 16 * 17],
        "{}",
        outline(&stats.nests)
    );
    assert!(stats.coverage() > 0.999, "coverage {}", stats.coverage());
    // The buffers hold what the code keeps in memory: not the products of the copies' fused
    // dots (each copy's second layer, 16 x 16, and output neuron, 16), kept in registers;
    // and less than a cache line before each hidden layer's weights, which start on one.
    let kept = stats.tape_nodes - 100 * (16 * 16 + 16);
    assert!(
        (kept..kept + 2 * 8).contains(&stats.buffered_slots),
        "{} buffered, {kept} kept",
        stats.buffered_slots
    );
    // The second layer's weights, which every copy shares, get their gradients after the
    // copies ran (the first layer's dots are too short to be dot loops).
    assert_eq!(nest.shared_grads, 1, "{}", outline(&stats.nests));
}

#[test]
fn moons_with_small_layers_on_every_lowering() {
    // 100 copies of MLP(2, [3, 3, 1]): the copies' nest, straight-line too.
    let g = Graph::new();
    Moons {
        layers: vec![3, 3, 1],
        ..Moons::demo()
    }
    .build(&g);
    let stats = check("moons 2-3-3-1", &g);
    let per_copy = 3 * 4 + 3 * 5 + 4;
    let copies = copy_nests(&stats, per_copy);
    assert_eq!(
        copies.iter().map(|n| n.count).collect::<Vec<_>>(),
        [100],
        "{}",
        outline(&stats.nests)
    );
}

/// The minibatch family at a tiny width: B copies of a 12-6-3 classifier.
fn minibatch(g: &Graph, b: usize) {
    Minibatch {
        nin: 12,
        hidden: 6,
        classes: 3,
        seed: 0,
        samples: Minibatch::synthetic_samples(12, 3, b, 1),
    }
    .build(g);
}

/// Nodes of one copy of the 12-6-3 classifier with its softmax cross-entropy: 6 neurons of
/// 12 products, a sum and a relu; 3 of 6 products and a sum; the loss's 2 `max`, 3 `sub`, 3
/// `exp`, a sum, a log, an add, 3 products, a sum and a sub.
const MINIBATCH_COPY_NODES: usize = 6 * 14 + 3 * 7 + 16;

#[test]
fn minibatch_is_one_nest_over_the_batch() {
    // 3 and 4 copies too: a batch nests however few copies repeat.
    for b in [3, 4, 5, 8] {
        let g = Graph::new();
        minibatch(&g, b);
        let name = format!("minibatch B = {b}");
        let stats = check(&name, &g);
        assert_eq!(
            outline(&stats.nests),
            format!("{b}x{}[6x84~]", b * MINIBATCH_COPY_NODES),
            "{name}"
        );
        // The first layer's weights: added over the copies, in chunks whose last one is
        // partial for B = 3 and 5.
        assert_eq!(stats.nests[0].shared_grads, 1, "{name}");
    }
}

/// `copies` copies of one layer of `neurons` neurons of 12 products each on inputs of their
/// own, sharing the layer's params, the loss the mean squared error of the neurons' sum;
/// where `reread(c)`, copy `c` also multiplies its output by the first weight.
fn copies_of_a_wide_layer(
    g: &Graph,
    copies: usize,
    neurons: usize,
    reread: impl Fn(usize) -> bool,
) {
    let mut rng = StdRng::seed_from_u64(3);
    let layer = Layer::new(g, 12, neurons, Activation::Relu, &mut rng);
    let w0 = layer.neurons[0].w[0];
    let x = g.inputs(12 * copies);
    let targets = g.inputs_without_grad(copies);
    let outs: Vec<Value> = x
        .chunks(12)
        .enumerate()
        .map(|(c, xc)| {
            let h = layer.call(xc).expect("12 inputs");
            let out = g.sum(&h);
            if reread(c) {
                out * w0
            } else {
                out
            }
        })
        .collect();
    set_mse(g, &outs, &targets);
}

#[test]
fn shared_weights_of_a_layer_in_several_lane_groups() {
    // 72 neurons run in 3 groups of 24 lanes: the shared gradients are added group by group.
    let g = Graph::new();
    copies_of_a_wide_layer(&g, 9, 72, |_| false);
    let name = "9 copies of a layer of 72 neurons";
    let stats = check_with(name, &g, false);
    let outer = largest(&stats);
    assert_eq!(outer.count, 9, "{name}: {}", outline(&stats.nests));
    assert_eq!(outer.shared_grads, 1, "{name}: {}", outline(&stats.nests));
}

#[test]
fn shared_weights_are_added_after_the_copies_unless_a_copy_adds_into_them_again() {
    // 11 copies: a full chunk and a partial one; 20: two full chunks and a partial one.
    for copies in [11, 20] {
        for (case, reread, shared) in [
            ("alone", None, 1),
            ("every copy rereads a weight", Some(usize::MAX), 0),
            // The copies on either side of it nest apart, each nest adding after its copies.
            ("the middle copy rereads a weight", Some(copies / 2), 1),
        ] {
            let g = Graph::new();
            copies_of_a_wide_layer(&g, copies, 8, |c| {
                reread.is_some_and(|r| r == usize::MAX || r == c)
            });
            let name = format!("{copies} copies of a wide layer, {case}");
            let stats = check(&name, &g);
            let outer = largest(&stats);
            assert_eq!(
                outer.shared_grads,
                shared,
                "{name}: {}",
                outline(&stats.nests)
            );
        }
    }
}

/// The outermost nest that covers the most nodes.
fn largest(stats: &JitStats) -> &NestStats {
    stats
        .nests
        .iter()
        .max_by_key(|n| n.nodes)
        .unwrap_or_else(|| panic!("no nest"))
}

#[test]
fn rnn_is_a_nest_over_its_steps() {
    let steps = 12;
    let g = Graph::new();
    Rnn {
        inputs: 3,
        hidden: 5,
        ..Rnn::new(steps)
    }
    .build(&g);
    let stats = check("rnn 3-5, T = 12", &g);
    // Step 0 reads constants where the others read the previous state: it stays outside.
    let steps_nest = largest(&stats);
    assert!(
        steps_nest.count as usize >= steps - 2,
        "{}",
        outline(&stats.nests)
    );
    // Each step: the cell's 5 neurons (8 products, a sum, a tanh) and the readout (5
    // products and a sum).
    assert_eq!(steps_nest.nodes, steps_nest.count as usize * (5 * 10 + 6));
    assert_eq!(outline(&steps_nest.inner), "5x50~");
    // A step reads the one before: no lanes across steps.
    assert!(!steps_nest.lanes, "{}", outline(&stats.nests));
}

/// The mass-spring family at a tiny size: 4 masses, `steps` steps.
fn springs(g: &Graph, steps: usize) {
    springs_of(g, 4, steps);
}

/// The mass-spring family with `masses` masses, `steps` steps.
fn springs_of(g: &Graph, masses: usize, steps: usize) {
    Springs {
        masses,
        ..Springs::new(steps)
    }
    .build(g);
}

/// Nodes of one step of 4 masses: 11 per spring, 15 per mass.
const SPRINGS_STEP_NODES: usize = 4 * 11 + 4 * 15;

#[test]
fn springs_is_a_nest_over_its_steps() {
    let steps = 12;
    let g = Graph::new();
    springs(&g, steps);
    let stats = check("springs 4 masses, T = 12", &g);
    let steps_nest = largest(&stats);
    // Step 0 reads the inputs (the state, 4 apart), the last step computes positions only
    // (its forces and velocities are dead): steps 1 to T - 2 are alike (the test below
    // asks for all of them).
    assert!(
        steps_nest.count as usize >= steps - 3,
        "{}",
        outline(&stats.nests)
    );
    assert_eq!(
        steps_nest.nodes,
        steps_nest.count as usize * SPRINGS_STEP_NODES
    );
    // In each step, the 3 springs between masses and the 3 interior masses' updates, each in
    // lanes: the spring at the wall and the last mass lie in the buffers as one more
    // repetition of the nest beside them, so what a spring reads of the masses (itself and
    // its neighbour) lies side by side across the lanes. The steps, one after the other.
    assert_eq!(outline(&steps_nest.inner), "3x33~ 3x45~");
    assert!(!steps_nest.lanes, "{}", outline(&stats.nests));
}

/// Twelve masses: nests of 11 springs and 11 masses, lane groups of two vectors (8 and 3
/// lanes), across which a spring's `x[s] - x[s - 1]` and a mass's force add into
/// neighbouring windows of one gradient array (in registers, each slot's additions in the
/// interpreter's order).
#[test]
fn springs_of_twelve_masses_run_in_lanes_of_two_vectors() {
    let g = Graph::new();
    springs_of(&g, 12, 8);
    let stats = check("springs 12 masses, T = 8", &g);
    assert_eq!(outline(&largest(&stats).inner), "11x121~ 11x165~");
    // Each nest's first map (a spring's stretch `x[s] - x[s - 1]`, a mass's force
    // `tension[i + 1] - tension[i]`) adds into its operands from the last, which keeps each
    // gradient's additions in the interpreter's order across the lanes.
    for nest in &largest(&stats).inner {
        assert!(
            nest.backward_lanes && nest.operands_from_last > 0,
            "{nest:?}"
        );
    }
}

#[test]
fn springs_nest_every_alike_step() {
    let steps = 12;
    let g = Graph::new();
    springs(&g, steps);
    let jit = Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(OptLevel::O0)
        .compile(&g)
        .unwrap();
    let stats = jit.stats();
    assert!(
        largest(stats).count as usize >= steps - 2,
        "{}",
        outline(&stats.nests)
    );
}

/// A ring of `n` particles joined by springs to their neighbours (particle 0 and `n - 1`
/// join across the ring, so both differ from the others), integrated by Verlet over `steps`
/// steps: `x' = 2 x - x_prev + k_i (x_left + x_right - 2 x) dt^2`, every constant inline;
/// params the spring constants, the loss the MSE of the final positions.
fn ring(g: &Graph, n: usize, steps: usize) {
    let k: Vec<Value> = (0..n).map(|i| g.param(1.0 + 0.1 * i as f64)).collect();
    let mut prev = g.inputs_without_grad(n);
    let mut cur = g.inputs_without_grad(n);
    let targets = g.inputs_without_grad(n);
    for _ in 0..steps {
        let next: Vec<Value> = (0..n)
            .map(|i| {
                let (left, right) = (cur[(i + n - 1) % n], cur[(i + 1) % n]);
                let a = k[i] * (left + right - cur[i] * 2.0);
                cur[i] * 2.0 - prev[i] + a * 0.01
            })
            .collect();
        prev = std::mem::replace(&mut cur, next);
    }
    set_mse(g, &cur, &targets);
}

#[test]
fn a_ring_rollout_is_bit_identical() {
    // 3 and 4 particles: no inner repetition (2 interior particles at most); 5: the 3
    // interior ones repeat, and the steps nest.
    for n in [3, 4, 5] {
        let g = Graph::new();
        ring(&g, n, 14);
        let stats = check(&format!("ring of {n}, T = 14"), &g);
        if n == 5 {
            assert!(largest(&stats).count >= 14 - 3, "{}", outline(&stats.nests));
        }
    }
}

#[test]
fn a_ring_rollout_of_four_is_a_nest_over_its_steps() {
    let steps = 14;
    let g = Graph::new();
    ring(&g, 4, steps);
    let jit = Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(OptLevel::O0)
        .compile(&g)
        .unwrap();
    let stats = jit.stats();
    assert!(
        stats.nests.iter().any(|n| n.count as usize >= steps - 3),
        "{}",
        outline(&stats.nests)
    );
}

/// `n` bodies pulling on each other, `steps` explicit Euler steps: per body, a force from
/// every other body (`m_j * r / (r^2 + 0.01)^1.5`, so each body's pairs skip the one where
/// `j == i`), summed; the masses are params, the loss pulls the bodies to the origin.
fn n_body<'g>(g: &'g Graph, n: usize, steps: usize) {
    let m: Vec<Value> = (0..n).map(|i| g.param(1.0 + 0.1 * i as f64)).collect();
    let state = g.inputs_without_grad(4 * n);
    let mut x: Vec<Value> = state.iter().step_by(4).copied().collect();
    let mut y: Vec<Value> = state.iter().skip(1).step_by(4).copied().collect();
    let mut vx: Vec<Value> = state.iter().skip(2).step_by(4).copied().collect();
    let mut vy: Vec<Value> = state.iter().skip(3).step_by(4).copied().collect();
    let dt = 0.01;
    for _ in 0..steps {
        let (mut ax, mut ay) = (Vec::new(), Vec::new());
        for i in 0..n {
            let (mut fx, mut fy) = (Vec::new(), Vec::new());
            for j in (0..n).filter(|&j| j != i) {
                let (dx, dy) = (x[j] - x[i], y[j] - y[i]);
                let pull = m[j] * (dx * dx + dy * dy + 0.01).powf(-1.5);
                fx.push(dx * pull);
                fy.push(dy * pull);
            }
            ax.push(g.sum(&fx));
            ay.push(g.sum(&fy));
        }
        let next = |p: &[Value<'g>], v: &[Value<'g>], i: usize| p[i] + v[i] * dt;
        let (x2, y2): (Vec<Value>, Vec<Value>) =
            (0..n).map(|i| (next(&x, &vx, i), next(&y, &vy, i))).unzip();
        let (vx2, vy2): (Vec<Value>, Vec<Value>) = (0..n)
            .map(|i| (next(&vx, &ax, i), next(&vy, &ay, i)))
            .unzip();
        (x, y, vx, vy) = (x2, y2, vx2, vy2);
    }
    let pulls: Vec<Value> = (0..n).map(|i| x[i] * x[i] + y[i] * y[i]).collect();
    g.set_loss(g.sum(&pulls)).unwrap();
}

#[test]
fn an_n_body_rollout_is_a_nest_over_its_steps() {
    // The pairs of each body split where `j == i` is skipped: per step, runs of pairs that
    // differ from body to body, inside the nest over the steps.
    let steps = 10;
    let g = Graph::new();
    n_body(&g, 4, steps);
    let stats = check("n-body, 4 bodies, T = 10", &g);
    assert!(
        largest(&stats).count as usize >= steps - 2,
        "{}",
        outline(&stats.nests)
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Boundaries
// ---------------------------------------------------------------------------------------------

/// Where a copy that differs has its extra op, a tanh.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Extra {
    /// On its first hidden value, before the readout reads it: the copy itself differs.
    Inside,
    /// On its output: the copy is alike, one more node follows it.
    After,
}

/// `copies` copies of [`Body`] on inputs 4 apart, the loss their MSE; copy `c` with an extra
/// op where `extra(c)` says.
fn copies_with(g: &Graph, copies: usize, extra: impl Fn(usize) -> Option<Extra>) {
    let body = Body::new(g, 1);
    let x = g.inputs(BODY_IN * copies);
    let targets = g.inputs_without_grad(copies);
    let mut outs = Vec::new();
    for (c, xc) in x.chunks(BODY_IN).enumerate() {
        let mut h = body.layer.call(xc).expect("BODY_IN inputs");
        if extra(c) == Some(Extra::Inside) {
            h[0] = h[0].tanh();
        }
        let out = body.readout.call(&h).expect("six hidden values");
        outs.push(if extra(c) == Some(Extra::After) {
            out.tanh()
        } else {
            out
        });
    }
    set_mse(g, &outs, &targets);
}

#[test]
fn a_first_or_last_copy_that_differs_stays_outside() {
    let copies = 10;
    // Which copies differ, and how many copies are alike when the extra op is inside a copy
    // and when it follows it (a last copy followed by one more node is still alike).
    let cases: [(&str, &[usize], [u32; 2]); 4] = [
        ("first", &[0], [9, 9]),
        ("last", &[9], [9, 10]),
        ("first and last", &[0, 9], [8, 9]),
        ("none", &[], [10, 10]),
    ];
    for (which, differs, alike) in cases {
        for (extra, alike) in [Extra::Inside, Extra::After].into_iter().zip(alike) {
            let g = Graph::new();
            copies_with(&g, copies, |c| differs.contains(&c).then_some(extra));
            let name = format!("10 copies, {which} differs ({extra:?})");
            let stats = check(&name, &g);
            let nests = copy_nests(&stats, BODY_NODES);
            assert_eq!(
                nests.iter().map(|n| n.count).collect::<Vec<_>>(),
                [alike],
                "{name}: {}",
                outline(&stats.nests)
            );
            assert_eq!(outline(&nests[0].inner), BODY_LAYER, "{name}");
        }
    }
}

#[test]
fn a_copy_that_reads_its_neighbour() {
    let copies = 10;
    // Copy `c` reads, as its last input, the output of copy `c - back` or its first hidden
    // value (the first copies read inputs instead).
    for (back, reads_output) in [(1, true), (1, false), (2, true)] {
        let g = Graph::new();
        let body = Body::new(&g, 2);
        let x = g.inputs((BODY_IN - 1) * copies);
        let mut earlier = g.inputs(back);
        let targets = g.inputs_without_grad(copies);
        let mut outs = Vec::new();
        for (c, xc) in x.chunks(BODY_IN - 1).enumerate() {
            let mut inputs = xc.to_vec();
            inputs.push(earlier[c]);
            let h = body.layer.call(&inputs).unwrap();
            let out = body.readout.call(&h).unwrap();
            earlier.push(if reads_output { out } else { h[0] });
            outs.push(out);
        }
        set_mse(&g, &outs, &targets);
        let what = if reads_output {
            "output"
        } else {
            "first hidden value"
        };
        let name = format!("copies reading the {what} of the copy {back} before");
        let stats = check(&name, &g);
        let nests = copy_nests(&stats, BODY_NODES);
        assert_eq!(nests.len(), 1, "{name}: {}", outline(&stats.nests));
        assert!(
            nests[0].count as usize >= copies - back,
            "{name}: {}",
            outline(&stats.nests)
        );
        // Copies read earlier ones: never side by side.
        assert!(!nests[0].lanes, "{name}: {}", outline(&stats.nests));
    }
}

#[test]
fn copies_with_their_own_params_in_either_order() {
    // Each copy's output scaled by a param of its own; copy `c` reads param and inputs `c`,
    // or `copies - 1 - c` (its slots advance backwards).
    let copies = 10;
    for backwards in [false, true] {
        let g = Graph::new();
        let body = Body::new(&g, 11);
        let own: Vec<Value> = (0..copies)
            .map(|c| g.param(0.5 + 0.05 * c as f64))
            .collect();
        let x = g.inputs(BODY_IN * copies);
        let targets = g.inputs_without_grad(copies);
        let outs: Vec<Value> = (0..copies)
            .map(|c| {
                let k = if backwards { copies - 1 - c } else { c };
                body.call(&x[BODY_IN * k..BODY_IN * (k + 1)]) * own[k]
            })
            .collect();
        set_mse(&g, &outs, &targets);
        let name = format!("copies with own params, backwards: {backwards}");
        let stats = check(&name, &g);
        let nests = copy_nests(&stats, BODY_NODES + 1);
        assert_eq!(
            nests.iter().map(|n| n.count).collect::<Vec<_>>(),
            [copies as u32],
            "{name}: {}",
            outline(&stats.nests)
        );
    }

    // An ensemble: 8 bodies, each with params of its own, on the same inputs (with
    // gradient: theirs add up over the members), the loss on the members' mean.
    let g = Graph::new();
    let x = g.inputs(BODY_IN);
    let target = g.input_without_grad();
    let outs: Vec<Value> = (0..8).map(|m| Body::new(&g, 20 + m).call(&x)).collect();
    let mean = g.sum(&outs) * 0.125;
    g.set_loss((mean - target).powf(2.0)).unwrap();
    let stats = check("an ensemble of 8", &g);
    assert_eq!(
        copy_nests(&stats, BODY_NODES)
            .iter()
            .map(|n| n.count)
            .collect::<Vec<_>>(),
        [8],
        "{}",
        outline(&stats.nests)
    );
}

#[test]
fn a_stride_that_changes_midway() {
    let copies = 12;
    // The copies' first inputs advance by 2 for copies 0 to 6, then by 3 (overlapping
    // windows): the nests over the copies cover them all, none straddles the change.
    let g = Graph::new();
    let body = Body::new(&g, 3);
    let x = g.inputs(2 * 6 + 3 * 5 + BODY_IN);
    let targets = g.inputs_without_grad(copies);
    let start = |c: usize| if c <= 6 { 2 * c } else { 12 + 3 * (c - 6) };
    let outs: Vec<Value> = (0..copies)
        .map(|c| body.call(&x[start(c)..start(c) + BODY_IN]))
        .collect();
    set_mse(&g, &outs, &targets);
    let stats = check("copies advancing by 2, then 3", &g);
    let nests = copy_nests(&stats, BODY_NODES);
    assert_eq!(
        nests.iter().map(|n| n.count).collect::<Vec<_>>(),
        [7, 5],
        "{}",
        outline(&stats.nests)
    );

    // Each copy a layer of 4 tanh neurons over 8 inputs read 2 apart in copies 0 to 4, 3
    // apart in the others (its products a loop whose stride changes), copies 24 apart.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(4);
    let layer = Layer::new(&g, 8, 4, Activation::Tanh, &mut rng);
    let readout = Neuron::new(&g, 4, Activation::Linear, &mut rng);
    let x = g.inputs(24 * copies);
    let targets = g.inputs_without_grad(copies);
    let mut outs = Vec::new();
    let mut per_copy = 0;
    for c in 0..copies {
        let stride = if c < 5 { 2 } else { 3 };
        let xc: Vec<Value> = (0..8).map(|i| x[24 * c + stride * i]).collect();
        let (out, nodes) = nodes_of(&g, || readout.call(&layer.call(&xc).unwrap()).unwrap());
        outs.push(out);
        per_copy = nodes;
    }
    set_mse(&g, &outs, &targets);
    let stats = check("copies reading 2 apart, then 3 apart", &g);
    let nests = copy_nests(&stats, per_copy);
    assert_eq!(
        nests.iter().map(|n| n.count).collect::<Vec<_>>(),
        [5, 7],
        "{}",
        outline(&stats.nests)
    );
}

#[test]
fn a_block_interrupted_by_an_unrelated_node() {
    let copies = 10;
    // Between copies 4 and 5, a node of another op, or one of the op the copies end with.
    for interrupt in ["exp", "sum"] {
        let g = Graph::new();
        let body = Body::new(&g, 5);
        let x = g.inputs(BODY_IN * copies);
        let (a, b) = (g.input(), g.input());
        let targets = g.inputs_without_grad(copies);
        let mut outs = Vec::new();
        let mut extra = None;
        for (c, xc) in x.chunks(BODY_IN).enumerate() {
            if c == 5 {
                extra = Some(match interrupt {
                    "exp" => a.exp(),
                    _ => g.sum([a, b]),
                });
            }
            outs.push(body.call(xc));
        }
        let data = nn::mse(&outs, &targets).unwrap();
        g.set_loss(data + extra.unwrap() * 0.5).unwrap();
        let name = format!("copies interrupted by {interrupt}");
        let stats = check(&name, &g);
        let nests = copy_nests(&stats, BODY_NODES);
        assert_eq!(
            nests.iter().map(|n| n.count).collect::<Vec<_>>(),
            [5, 5],
            "{name}: {}",
            outline(&stats.nests)
        );
    }
}

#[test]
fn copies_that_differ_in_which_inputs_take_a_gradient() {
    let copies = 12;
    // Copies 0 to 5 read inputs with gradient, copies 6 to 11 inputs without, right after
    // them in slot order: the same slots advancing by the same amount, but not the same
    // shape. Two nests.
    let g = Graph::new();
    let body = Body::new(&g, 6);
    let mut x = g.inputs(BODY_IN * copies / 2);
    x.extend(g.inputs_without_grad(BODY_IN * copies / 2));
    let targets = g.inputs_without_grad(copies);
    let outs: Vec<Value> = x.chunks(BODY_IN).map(|xc| body.call(xc)).collect();
    set_mse(&g, &outs, &targets);
    let name = "6 copies on inputs with gradient, 6 without";
    let stats = check(name, &g);
    let nests = copy_nests(&stats, BODY_NODES);
    assert_eq!(
        nests.iter().map(|n| n.count).collect::<Vec<_>>(),
        [6, 6],
        "{name}: {}",
        outline(&stats.nests)
    );

    // Alternating: copy `c` reads inputs with gradient if `c` is even. Pairs of copies are
    // alike; a single copy's repetition is not.
    let g = Graph::new();
    let body = Body::new(&g, 7);
    let x: Vec<Value> = (0..copies)
        .flat_map(|c| {
            if c % 2 == 0 {
                g.inputs(BODY_IN)
            } else {
                g.inputs_without_grad(BODY_IN)
            }
        })
        .collect();
    let targets = g.inputs_without_grad(copies);
    let outs: Vec<Value> = x.chunks(BODY_IN).map(|xc| body.call(xc)).collect();
    set_mse(&g, &outs, &targets);
    let name = "copies alternating inputs with and without gradient";
    let stats = check(name, &g);
    assert_eq!(
        outline(&stats.nests),
        format!("6x{}[{BODY_LAYER} {BODY_LAYER}]", copies * BODY_NODES),
        "{name}"
    );

    // Copies 0 to 5 feed the loss, copies 6 to 11 are outputs only: outside the loss's cone,
    // their nodes take no gradient. Two nests.
    let g = Graph::new();
    let body = Body::new(&g, 12);
    let x = g.inputs(BODY_IN * copies);
    let targets = g.inputs_without_grad(copies / 2);
    let outs: Vec<Value> = x.chunks(BODY_IN).map(|xc| body.call(xc)).collect();
    for &out in &outs[copies / 2..] {
        g.add_output(out).unwrap();
    }
    set_mse(&g, &outs[..copies / 2], &targets);
    let name = "6 copies in the loss's cone, 6 outside";
    let stats = check(name, &g);
    let nests = copy_nests(&stats, BODY_NODES);
    assert_eq!(
        nests.iter().map(|n| n.count).collect::<Vec<_>>(),
        [6, 6],
        "{name}: {}",
        outline(&stats.nests)
    );
}

#[test]
fn copies_reading_params_then_inputs_in_consecutive_slots() {
    // Params take slots 0..P in creation order, inputs P.. in theirs: copies 0 to 5 read the
    // last params made, copies 6 to 11 the first inputs. Their slots advance by 4 across the
    // boundary, and inputs made with `input` take gradients as params do; but params are
    // trained and moved by the layout pass, inputs are not.
    let copies = 12;
    for input_grad in [true, false] {
        let g = Graph::new();
        let body = Body::new(&g, 8);
        let mut x: Vec<Value> = (0..BODY_IN * copies / 2)
            .map(|i| g.param(0.1 * i as f64 - 1.0))
            .collect();
        x.extend(if input_grad {
            g.inputs(BODY_IN * copies / 2)
        } else {
            g.inputs_without_grad(BODY_IN * copies / 2)
        });
        let targets = g.inputs_without_grad(copies);
        let outs: Vec<Value> = x.chunks(BODY_IN).map(|xc| body.call(xc)).collect();
        set_mse(&g, &outs, &targets);
        let name = format!("6 copies on params, 6 on inputs (gradient: {input_grad})");
        let stats = check(&name, &g);
        let counts: Vec<u32> = copy_nests(&stats, BODY_NODES)
            .iter()
            .map(|n| n.count)
            .collect();
        // With gradient the two halves are alike (recovery makes one nest of 12, which runs
        // exactly); without, the inputs' gradient sets them apart.
        if input_grad {
            assert_eq!(counts.iter().sum::<u32>(), 12, "{name}: {counts:?}");
        } else {
            assert_eq!(counts, [6, 6], "{name}: {}", outline(&stats.nests));
        }
    }
}

#[test]
fn copies_that_differ_only_in_a_constant() {
    // Copy `c`'s output times `1 + 0.1 c` (a constant made at each use: a leaf whose value
    // differs per copy, read from its slot): one nest. Raised to the power 1 or 2 in turn (the
    // exponent is part of the op): no nest of single copies, one over pairs.
    let copies = 10;
    for powers in [false, true] {
        let g = Graph::new();
        let body = Body::new(&g, 13);
        let x = g.inputs(BODY_IN * copies);
        let targets = g.inputs_without_grad(copies);
        let outs: Vec<Value> = x
            .chunks(BODY_IN)
            .enumerate()
            .map(|(c, xc)| {
                let out = body.call(xc);
                if powers {
                    out.powf(1.0 + (c % 2) as f64)
                } else {
                    out * (1.0 + 0.1 * c as f64)
                }
            })
            .collect();
        set_mse(&g, &outs, &targets);
        let name = if powers {
            "powers 1, 2, 1, ..."
        } else {
            "scaled by 1 + 0.1 c"
        };
        let stats = check(name, &g);
        let per_copy = BODY_NODES + 1;
        let expected = if powers {
            format!("5x{}[{BODY_LAYER} {BODY_LAYER}]", copies * per_copy)
        } else {
            format!("10x{}[{BODY_LAYER}]", copies * per_copy)
        };
        assert_eq!(outline(&stats.nests), expected, "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Depth
// ---------------------------------------------------------------------------------------------

#[test]
fn copies_of_steps_of_neurons_nest_three_deep() {
    // 6 copies (sharing params) of an RNN over 5 steps of 2 inputs: 4 tanh neurons over
    // the step's inputs and the previous state (6 products, a sum, a tanh: 32 nodes a step),
    // a linear readout of the last state.
    let (copies, steps) = (6, 5);
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(9);
    let cell = Layer::new(&g, 2 + 4, 4, Activation::Tanh, &mut rng);
    let readout = Neuron::new(&g, 4, Activation::Linear, &mut rng);
    let x = g.inputs(copies * steps * 2);
    let targets = g.inputs_without_grad(copies);
    let h0 = g.inputs_without_grad(4);
    let mut outs = Vec::new();
    for xc in x.chunks(steps * 2) {
        let mut h = h0.clone();
        for xt in xc.chunks(2) {
            let mut xh = xt.to_vec();
            xh.extend(&h);
            h = cell.call(&xh).unwrap();
        }
        outs.push(readout.call(&h).unwrap());
    }
    set_mse(&g, &outs, &targets);
    let stats = check("copies of steps of neurons", &g);
    // A copy: step 0 (its state the shared inputs) as a nest of neurons, then the other
    // steps as a nest of such nests, then the readout.
    let per_copy = steps * 32 + 5;
    assert_eq!(
        outline(&stats.nests),
        format!(
            "{copies}x{}[4x32~ {}x{}[4x32~]]",
            copies * per_copy,
            steps - 1,
            (steps - 1) * 32
        ),
    );
    assert_eq!(stats.nest_depth, 3);
}

/// `tanh(sum(units))` over 3 units of level `level - 1`, each at inputs `3^(level - 1)`
/// further on; level 0 is `tanh(b + w . x[at..at + 10])` (12 nodes).
fn level<'g>(w: &[Value<'g>], x: &[Value<'g>], level: u32, at: usize) -> Value<'g> {
    let g = w[0].graph();
    if level == 0 {
        let terms = w[1..].iter().zip(&x[at..]).map(|(&w, &x)| w * x);
        return g.sum(std::iter::once(w[0]).chain(terms)).tanh();
    }
    let units: Vec<Value> = (0..3)
        .map(|k| self::level(w, x, level - 1, at + k * 3usize.pow(level - 1)))
        .collect();
    g.sum(&units).tanh()
}

#[test]
fn structure_deeper_than_the_deepest_nest() {
    // Five levels of 3 repetitions over 12-node units: the inner four nest, 4 deep (the
    // most `Affine` has coefficients for); the fifth stays 3 nests and the nodes joining them.
    let g = Graph::new();
    let w: Vec<Value> = (0..11).map(|i| g.param(0.1 * i as f64 - 0.5)).collect();
    let x = g.inputs(3usize.pow(5) + 9);
    let top = level(&w, &x, 5, 0);
    g.set_loss(top * top).unwrap();
    let stats = check("five levels of three", &g);
    assert_eq!(stats.nest_depth, 4, "{}", outline(&stats.nests));
    assert_eq!(stats.nests.len(), 3, "{}", outline(&stats.nests));
    for nest in &stats.nests {
        assert_eq!(
            (nest.count, depth(nest)),
            (3, 4),
            "{}",
            outline(&stats.nests)
        );
    }

    // Four levels: one nest, four deep.
    let g = Graph::new();
    let w: Vec<Value> = (0..11).map(|i| g.param(0.1 * i as f64 - 0.5)).collect();
    let x = g.inputs(3usize.pow(4) + 9);
    let top = level(&w, &x, 4, 0);
    g.set_loss(top * top).unwrap();
    let stats = check("four levels of three", &g);
    assert_eq!(stats.nest_depth, 4, "{}", outline(&stats.nests));
}

#[test]
fn tiny_repetitions() {
    // Two copies: too few to nest (each copy's layer still is one).
    let g = Graph::new();
    copies_with(&g, 2, |_| None);
    let stats = check("2 copies", &g);
    assert_eq!(outline(&stats.nests), format!("{BODY_LAYER} {BODY_LAYER}"));

    // Three copies of one node: far too small.
    let g = Graph::new();
    let x = g.inputs(3);
    let outs: Vec<Value> = x.iter().map(|v| v.tanh()).collect();
    g.set_loss(g.sum(&outs)).unwrap();
    let stats = check("3 copies of 1 node", &g);
    assert!(stats.nests.is_empty(), "{}", outline(&stats.nests));

    // 2 to 4 copies of a chain of 1 to 12 nodes, around the smallest nest worth a loop (32
    // nodes): whatever nests, nests whole copies. (3 copies of 11 nodes are not nested: as
    // for 3 copies of the minibatch, their period, 3 items, is never tried.)
    for copies in 2..=4 {
        for len in [1, 2, 10, 11, 12] {
            let g = Graph::new();
            let w = g.param(0.7);
            let x = g.inputs(copies);
            let outs: Vec<Value> = x
                .iter()
                .map(|&v| {
                    (0..len).fold(v, |v, k| match k % 3 {
                        0 => v * w,
                        1 => v.tanh(),
                        _ => v + w,
                    })
                })
                .collect();
            g.set_loss(g.sum(&outs)).unwrap();
            let name = format!("{copies} copies of {len} nodes");
            let stats = check(&name, &g);
            for n in &stats.nests {
                assert!(
                    n.count as usize == copies && n.nodes == copies * len,
                    "{name}: {}",
                    outline(&stats.nests)
                );
            }
        }
    }
}

/// The code is flat in the number of steps: the full families (16 masses; a 16-unit RNN)
/// at T = 50 and T = 400 compile to about as many IR instructions. (The zeroing of the
/// gradients the steps accumulate once grew with T: a step's runs of slots outnumbered what
/// `repeated_runs` looked for, and each became a store.)
#[test]
fn rollouts_compile_to_code_flat_in_their_steps() {
    let instructions = |build: &dyn Fn(&Graph)| {
        let g = Graph::new();
        build(&g);
        Jit::builder()
            .tiering(Tiering::Off)
            .compile(&g)
            .unwrap()
            .stats()
            .ir_instructions
    };
    for (name, short, long) in [
        (
            "springs",
            instructions(&|g| {
                Springs::new(50).build(g);
            }),
            instructions(&|g| {
                Springs::new(400).build(g);
            }),
        ),
        (
            "rnn",
            instructions(&|g| {
                Rnn::new(50).build(g);
            }),
            instructions(&|g| {
                Rnn::new(400).build(g);
            }),
        ),
    ] {
        assert!(
            long <= short + short / 5,
            "{name}: {short} IR instructions at T = 50, {long} at T = 400"
        );
    }
}
