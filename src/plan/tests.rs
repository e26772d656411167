//! The schedules and plans real graphs get, inspected without LLVM (the integration tests in
//! tests/loops.rs run the same graphs against the interpreter).

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{lanes::lane_group, GradMemory, NestPlan, Nests, Plan, PlanOptions, ZeroSkipping};
use crate::nn::{Activation, Classifier, Layer};
use crate::passes::layout;
use crate::passes::loops::schedule;
use crate::passes::schedule::{Item, Nest};
use crate::tape::Slot;
use crate::{Graph, Tape, Value};

#[test]
fn schedules_cover_every_node_once_in_order() {
    let g = Graph::new();
    Classifier::new(&g, 20, &[6], 4, &mut StdRng::seed_from_u64(0)).unwrap();
    let tape = Tape::from_graph(&g).unwrap();
    let first = (tape.num_params() + tape.num_inputs()) as u32;
    for recover in [false, true] {
        let s = schedule(&tape, recover);
        let mut covered = Vec::new();
        for item in s.items.iter().flat_map(Item::flattened) {
            match item {
                Item::Straight(r) => covered.extend(r.clone()),
                Item::Map(m) => {
                    let (a, b) = (m.out.at(0).0, m.out.at(m.len - 1).0);
                    covered.extend(a..=b);
                }
                Item::Sum(sum) => covered.push(sum.slot.at(0).0),
                Item::Dot(d) => {
                    let (a, b) = (
                        d.products.out.at(0).0,
                        d.products.out.at(d.products.len - 1).0,
                    );
                    covered.extend(a..=b);
                    covered.push(d.sum.slot.at(0).0);
                }
                Item::Nest(_) | Item::SumPart { .. } => unreachable!("flattened, no parts"),
            }
        }
        assert_eq!(
            covered,
            (first..tape.len() as u32).collect::<Vec<_>>(),
            "recover {recover}"
        );
        if recover {
            // First a nest over the 6 hidden neurons: its 20 products fused into its sum,
            // its relu. The 4 outputs' short runs are nests of single nodes.
            let nests: Vec<_> = s
                .items
                .iter()
                .filter_map(|i| match i {
                    Item::Nest(n) => Some(n),
                    _ => None,
                })
                .collect();
            assert_eq!(
                (nests[0].count, nests[0].body.len()),
                (6, 2),
                "{:?}",
                s.items
            );
            assert!(matches!(nests[0].body[0], Item::Dot(_)));
            assert!(s.loop_nodes >= 6 * (20 + 1 + 1));
        } else {
            assert_eq!(s.loops, 0);
        }
    }
}

/// `g`'s tape after the param layout the JIT applies, and its verified plan.
fn planned(g: &Graph) -> (Tape, Plan) {
    planned_with(g, ZeroSkipping::Auto)
}

/// [`planned`], skipping zero inputs as `zero_skipping` says.
fn planned_with(g: &Graph, zero_skipping: ZeroSkipping) -> (Tape, Plan) {
    planned_recovering(g, zero_skipping, true)
}

/// [`planned_with`], with loop recovery on or off.
fn planned_recovering(g: &Graph, zero_skipping: ZeroSkipping, recover: bool) -> (Tape, Plan) {
    let tape = Tape::from_graph(g).unwrap();
    let s = schedule(&tape, recover);
    let (tape, s) = layout::apply(tape, s).unwrap();
    let options = PlanOptions {
        chunk_size: 250,
        fast_math: false,
        zero_skipping,
        host_avx512: false,
    };
    let plan = Plan::new(&tape, &s, options).unwrap();
    plan.verify(&tape).unwrap();
    (tape, plan)
}

/// Five copies of a 2-16-16 MLP sharing params (the shape of micrograd's moons demo).
fn copies_of_two_layers(g: &Graph, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let l1 = Layer::new(g, 2, 16, Activation::Relu, &mut rng);
    let l2 = Layer::new(g, 16, 16, Activation::Relu, &mut rng);
    let mut terms = Vec::new();
    for _ in 0..5 {
        let x = g.inputs(2);
        terms.extend(l2.call(&l1.call(&x).unwrap()).unwrap());
    }
    g.set_loss(g.sum(&terms)).unwrap();
}

/// The nests of `g`'s plan, after the param layout the JIT applies, as (count, whether
/// backward runs in lanes).
fn nests_of(g: &Graph) -> Vec<(u32, bool)> {
    let (_, plan) = planned(g);
    plan.functions
        .iter()
        .flatten()
        .filter_map(|i| match i {
            Item::Nest(n) => Some((n.count, plan.nest(n).lanes.backward().is_some())),
            _ => None,
        })
        .collect()
}

#[test]
fn layers_wider_than_a_lane_group_run_backward_in_lanes() {
    // 70: one group of 64 and a rest of 6; 130: a loop over two groups of 64 and a rest of
    // 2; 136: a loop over 17 groups of 8 (the largest multiple of 8 that divides it).
    for (width, group) in [(70, 64), (130, 64), (136, 8)] {
        assert_eq!(lane_group(width), group);
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(12);
        let layer = Layer::new(&g, 9, width as usize, Activation::Tanh, &mut rng);
        let x = g.inputs(9);
        let out = layer.call(&x).unwrap();
        g.set_loss(g.sum(out.iter().map(|&o| o * o))).unwrap();
        assert_eq!(nests_of(&g), vec![(width, true)]);
    }
}

#[test]
fn a_nest_whose_lane_order_would_reorder_a_gradient_runs_neuron_by_neuron() {
    // Every neuron adds into `shared` from two body items; side by side, all of the second
    // item's additions would come before all of the first's.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(13);
    let layer = Layer::new(&g, 10, 6, Activation::Linear, &mut rng);
    let shared = g.param(0.3);
    let x = g.inputs(10);
    let out: Vec<Value> = layer
        .neurons
        .iter()
        .map(|n| (n.call(&x).unwrap() * shared) + shared)
        .collect();
    g.set_loss(g.sum(out.iter().map(|&o| o * o))).unwrap();
    // The layer's nest (the squares of the loss follow in a nest of their own).
    let nests = nests_of(&g);
    assert!(nests[0].0 >= 3 && !nests[0].1, "{nests:?}");
}

/// `Plan::verify` holds the lanes to the proofs that chose them: lanes over a nest whose lane
/// order would reorder a gradient, or a chain's links adding from the first operand where the
/// order needs the last, are refused, as are buffers too short for a loop's addresses.
#[test]
fn plans_whose_lanes_or_addresses_break_a_proof_are_refused() {
    use crate::plan::Lanes;
    /// The error `verify` gives the plan with `change` made to its nests' plans.
    fn tampered(plan: &Plan, tape: &Tape, change: &dyn Fn(&mut NestPlan) -> bool) -> String {
        let mut plan = plan.clone();
        let mut changed = false;
        for nest in plan.nests.plans_mut() {
            changed |= change(nest);
        }
        assert!(changed, "nothing to tamper with");
        plan.verify(tape).expect_err("a tampered plan").to_string()
    }
    // The layer whose lane order would reorder a gradient runs forward in lanes only.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(13);
    let layer = Layer::new(&g, 10, 6, Activation::Linear, &mut rng);
    let shared = g.param(0.3);
    let x = g.inputs(10);
    let out: Vec<Value> = (layer.neurons.iter())
        .map(|n| (n.call(&x).unwrap() * shared) + shared)
        .collect();
    g.set_loss(g.sum(out.iter().map(|&o| o * o))).unwrap();
    let (tape, plan) = planned(&g);
    let both = |n: &mut NestPlan| match n.lanes {
        Lanes::Forward { group } => {
            n.lanes = Lanes::Both {
                group,
                vertical: false,
            };
            true
        }
        _ => false,
    };
    let refused = tampered(&plan, &tape, &both);
    assert!(refused.contains("reorder a gradient"), "{refused}");
    // A chain's links turned back to their first operand first.
    let g = Graph::new();
    chain(&g, 12, 20);
    let (tape, plan) = planned(&g);
    let first_operand_first =
        |n: &mut NestPlan| std::mem::take(&mut n.operands_from_last).contains(&true);
    let refused = tampered(&plan, &tape, &first_operand_first);
    assert!(refused.contains("reorder a gradient"), "{refused}");
    // Buffers shorter than the addresses the loops form.
    let mut short = plan.clone();
    short.buffers = std::sync::Arc::new(super::Buffers::slot_by_slot(tape.len() / 2, None));
    let refused = short.verify(&tape).expect_err("short buffers").to_string();
    assert!(refused.contains("outside buffers"), "{refused}");
}

/// `Plan::verify` refuses a plan whose loops would reach a local value or gradient outside
/// the function's scratch (in the buffers, which do not keep it).
#[test]
fn plans_whose_loops_miss_a_local_are_refused() {
    let g = Graph::new();
    chain(&g, 12, 20);
    let (tape, plan) = planned(&g);
    assert!(plan.local_values.count() + plan.grads.local.count() > 0);
    let mut lost = plan.clone();
    lost.local_values.forget_places();
    lost.grads.local.forget_places();
    let refused = lost
        .verify(&tape)
        .expect_err("locals outside scratch")
        .to_string();
    assert!(refused.contains("outside its scratch"), "{refused}");
}

#[test]
fn modules_cover_the_functions_in_runs_of_bounded_size() {
    use super::functions::{forward_functions, modules, MODULE_FUNCTIONS, MODULE_MULTIPLE};
    for n in [0, 1, 2, 3, 5, 7, 8, 9, 63, 64, 65, 257, 1000, 4099] {
        let m = modules(n);
        // Every function's forward variant is defined once, by another module than its
        // backward variants wherever there are two.
        let mut forward: Vec<_> = (0..m.len()).map(|k| forward_functions(&m, k)).collect();
        assert!(
            (0..m.len()).all(|k| m.len() == 1 || forward[k] != m[k]),
            "{n}"
        );
        forward.sort_by_key(|r| r.start);
        assert_eq!(forward, m, "{n}");
        assert_eq!(m[0].start, 0, "{n}");
        assert!(m.windows(2).all(|w| w[0].end == w[1].start), "{n}: {m:?}");
        assert_eq!(m.last().unwrap().end, n);
        assert!(m.iter().all(|r| r.len() <= MODULE_FUNCTIONS), "{n}");
        if n < MODULE_MULTIPLE {
            assert_eq!(m.len(), n.max(1), "{n}");
        } else {
            assert_eq!(m.len() % MODULE_MULTIPLE, 0, "{n}");
            assert!(m.iter().all(|r| !r.is_empty()), "{n}: {m:?}");
            let (min, max) = (
                m.iter().map(|r| r.len()).min(),
                m.iter().map(|r| r.len()).max(),
            );
            assert!(max.unwrap() - min.unwrap() <= 1, "{n}: {m:?}");
        }
    }
}

#[test]
fn repeated_runs_cover_exactly_the_slots_and_roll_copies() {
    use super::memory::{repeated_runs, RepeatedRuns};
    let expand = |blocks: &[RepeatedRuns], len: usize| {
        let mut which = vec![false; len];
        for b in blocks {
            for c in 0..b.count {
                for r in &b.runs {
                    for s in r.start + c * b.stride..r.end + c * b.stride {
                        assert!(!which[s as usize], "slot {s} twice");
                        which[s as usize] = true;
                    }
                }
            }
        }
        which
    };
    // A head run, then 100 copies of 17 runs of 2 slots every 18 slots, 40 slots apart,
    // then a tail: three blocks.
    let mut which = vec![false; 100 * 400 + 100];
    which[3..67].iter_mut().for_each(|w| *w = true);
    for c in 0..100 {
        for q in 0..17 {
            let s = 100 + c * 400 + q * 18;
            which[s] = true;
            which[s + 1] = true;
        }
    }
    which[100 * 400 + 50] = true;
    let blocks = repeated_runs(&which);
    assert_eq!(expand(&blocks, which.len()), which);
    assert_eq!(blocks.len(), 3, "{blocks:?}");
    assert_eq!((blocks[1].runs.len(), blocks[1].count), (17, 100));
    // A rollout step's hundreds of runs repeat too.
    let mut which = vec![false; 50 * 1000];
    for step in 0..50 {
        for q in 0..300 {
            which[step * 1000 + 3 * q + (q % 2)] = true;
        }
    }
    let blocks = repeated_runs(&which);
    assert_eq!(expand(&blocks, which.len()), which);
    assert_eq!(
        (blocks[0].runs.len(), blocks[0].count),
        (300, 50),
        "{}",
        blocks.len()
    );
    // Random sets are covered exactly too.
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..50 {
        use rand::Rng;
        let len = rng.gen_range(0..300);
        let density = rng.gen_range(0.0..1.0);
        let which: Vec<bool> = (0..len).map(|_| rng.gen_bool(density)).collect();
        assert_eq!(expand(&repeated_runs(&which), len), which);
    }
}

#[test]
fn copies_of_a_layer_read_by_every_neuron_take_the_vertical_order() {
    use crate::plan::Lanes;
    let g = Graph::new();
    copies_of_two_layers(&g, 1);
    let (_, plan) = planned(&g);
    let mut lanes = Vec::new();
    for item in plan.functions.iter().flatten() {
        collect_lanes(&plan.nests, item, &mut lanes);
    }
    assert!(
        lanes.contains(&Lanes::Both {
            group: 16,
            vertical: true
        }),
        "{lanes:?}"
    );
}

/// A readout over 13 or 50 hidden units (not whole blocks of 8 steps) takes the vertical
/// order all the same: the steps after the last whole block add lane by lane
/// (`passes::lane_order::vertical_block`), so nothing sums its gradients from 0 in a block.
#[test]
fn a_readout_of_steps_not_in_whole_blocks_takes_the_vertical_order() {
    use crate::passes::lane_order::vertical_block;
    use crate::plan::Lanes;
    assert_eq!(
        (0..13).map(|t| vertical_block(t, 13)).collect::<Vec<_>>(),
        [vec![Some(0); 8], vec![None; 5]].concat()
    );
    assert_eq!(vertical_block(49, 50), None);
    assert_eq!(vertical_block(47, 50), Some(0));
    assert_eq!(vertical_block(0, 50), Some(5));
    for hidden in [13, 50] {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(3);
        Classifier::new(&g, 20, &[hidden], 10, &mut rng).unwrap();
        let (tape, plan) = planned(&g);
        let mut lanes = Vec::new();
        for item in plan.functions.iter().flatten() {
            collect_lanes(&plan.nests, item, &mut lanes);
        }
        let vertical = Lanes::Both {
            group: 10,
            vertical: true,
        };
        assert!(lanes.contains(&vertical), "{hidden} hidden: {lanes:?}");
        let summed = (0..tape.len()).filter(|&s| plan.grads.sums_whole(s as i64));
        assert_eq!(summed.count(), 0, "{hidden} hidden");
    }
}

/// An Elman cell over 3 inputs (without gradient) and `hidden` state values, run for 6
/// steps from an initial state that takes a gradient; the loss squares the last state and,
/// with `readout`, a neuron's reading of every state. A neuron's sum adds its input terms
/// (single products), then its state terms (a map of products).
fn recurrent_cells(g: &Graph, hidden: usize, readout: bool) {
    let mut rng = StdRng::seed_from_u64(hidden as u64);
    let cell = Layer::new(g, 3 + hidden, hidden, Activation::Tanh, &mut rng);
    let out = Layer::new(g, hidden, 1, Activation::Linear, &mut rng);
    let mut h: Vec<Value> = g.inputs(hidden);
    let mut terms = Vec::new();
    for _ in 0..6 {
        let mut xh = g.inputs_without_grad(3);
        xh.extend(&h);
        h = cell.call(&xh).unwrap();
        if readout {
            terms.extend(out.call(&h).unwrap());
        }
    }
    terms.extend(&h);
    g.set_loss(g.sum(terms.iter().map(|&t| t * t))).unwrap();
}

#[test]
fn a_recurrent_cells_sums_are_dots_after_their_input_terms_in_the_vertical_order() {
    use crate::plan::Lanes;
    for readout in [false, true] {
        let g = Graph::new();
        recurrent_cells(&g, 16, readout);
        let (tape, plan) = planned(&g);
        let mut lanes = Vec::new();
        let mut heads = Vec::new();
        for item in plan.functions.iter().flatten() {
            collect_lanes(&plan.nests, item, &mut lanes);
            let _ = item.try_for_each_flat(&mut |flat, _| {
                if let Item::Dot(dot) = flat {
                    heads.push((dot.head(), dot.products.len));
                }
                Ok::<(), ()>(())
            });
        }
        // Every step's 16 neurons: the 3 input terms (single products), then a dot over
        // the 16 state values. (The readouts' and the loss's sums are dots too.)
        let cells = heads.iter().filter(|&&h| h == (3, 16)).count();
        assert_eq!(cells, 16 * 6, "{heads:?}");
        let vertical = Lanes::Both {
            group: 16,
            vertical: true,
        };
        assert!(lanes.contains(&vertical), "readout {readout}: {lanes:?}");
        // Where the next step's 16 neurons make a state's every addition, its gradient sums
        // from 0 in the vertical block (no zeroing): without a readout every state the cells
        // read, with one only the initial state (no readout reads it).
        let summed = (0..tape.len())
            .filter(|&s| plan.grads.sums_whole(s as i64))
            .count();
        match readout {
            false => assert!(summed >= 16 * 5, "{summed} states sum from 0"),
            true => assert_eq!(summed, 16),
        }
    }
}

/// The values a nest's repetitions write lie item by item in the buffers: each item's value
/// in the 16 neurons of a recurrent cell side by side (one vector for lanes to load and
/// store), where the tape has them a repetition (the neuron's own nodes) apart.
#[test]
fn a_nests_values_lie_item_by_item_in_the_buffers() {
    use crate::passes::schedule::{Access, AccessKind};
    /// The values written by the flat nests of `item`, with the level of their repetitions.
    fn written(item: &Item, level: usize, out: &mut Vec<(Access, usize)>) {
        let Item::Nest(nest) = item else { return };
        if nest.body.iter().any(|b| matches!(b, Item::Nest(_))) {
            nest.body.iter().for_each(|b| written(b, level + 1, out));
            return;
        }
        let writes = nest.body.iter().flat_map(Item::accesses);
        out.extend(
            writes
                .filter(|a| matches!(a.kind, AccessKind::Writes { .. }))
                .map(|a| (a, level)),
        );
    }
    let g = Graph::new();
    recurrent_cells(&g, 16, true);
    let (_, plan) = planned(&g);
    let mut values = Vec::new();
    for item in plan.functions.iter().flatten() {
        written(item, 0, &mut values);
    }
    let kept: Vec<_> = values
        .iter()
        .filter(|(a, _)| plan.kept.get(a.at.at(0).index()))
        .collect();
    // The first step's nest and the nest in the other steps' nest: each neuron's 3 input
    // terms, its sum and its tanh.
    assert_eq!(kept.len(), 2 * 5, "{kept:?}");
    for (a, level) in kept {
        assert!(a.at.outer[*level] > 1, "{a:?} already adjacent on the tape");
        assert_eq!(plan.buffers.affine(a.at).outer[*level], 1, "{a:?}");
    }
}

fn collect_lanes(nests: &super::Nests, item: &Item, out: &mut Vec<crate::plan::Lanes>) {
    if let Item::Nest(n) = item {
        out.push(nests.of(n).lanes);
        n.body.iter().for_each(|b| collect_lanes(nests, b, out));
    }
}

/// For [`copies_of_two_layers`] planned: its tape, the slots `which` marks in the plan's
/// gradient memory, and which gradients backward's first function zeroes.
fn marked_slots(seed: u64, which: fn(&GradMemory, i64) -> bool) -> (Tape, Vec<usize>, Vec<bool>) {
    let g = Graph::new();
    copies_of_two_layers(&g, seed);
    let (tape, plan) = planned(&g);
    let zeroed = (tape.slots())
        .map(|s| plan.grads.zeroed(&tape, s, false))
        .collect::<Vec<_>>();
    let marked = (0..tape.len())
        .filter(|&s| which(&plan.grads, s as i64))
        .collect();
    (tape, marked, zeroed)
}

#[test]
fn gradients_with_one_addition_from_a_loop_are_stored_not_zeroed() {
    let (tape, whole, zeroed) = marked_slots(2, GradMemory::stored_slot);
    // Each neuron's dot sum feeds only its relu: one addition each, in every copy.
    assert!(whole.len() >= 5 * 32, "{} slots stored whole", whole.len());
    for &s in &whole {
        assert!(!zeroed[s], "slot {s} is stored whole and zeroed");
        assert!(s >= tape.num_params(), "param {s} stored whole");
        assert_ne!(Some(crate::tape::Slot(s as u32)), tape.loss());
    }
}

/// A rollout of `steps` steps over `n` elements, each element of the state read by several
/// nodes of the next step (itself twice, its neighbour), the last state squared into the loss.
fn rollout(g: &Graph, n: usize, steps: usize) {
    let k = g.param(0.3);
    let mut x: Vec<Value> = g.inputs(n);
    for _ in 0..steps {
        x = (0..n)
            .map(|i| {
                let left = x[i.saturating_sub(1)];
                x[i] + ((x[i] - left) * k - x[i] * x[i] * 0.01)
            })
            .collect();
    }
    let squares: Vec<Value> = x.iter().map(|&v| v * v).collect();
    g.set_loss(g.sum(&squares)).unwrap();
}

#[test]
fn a_rollouts_state_is_stored_by_its_first_addition_not_zeroed() {
    let g = Graph::new();
    rollout(&g, 8, 40);
    let (tape, plan) = planned(&g);
    let zeroed = (tape.slots())
        .map(|s| plan.grads.zeroed(&tape, s, false))
        .collect::<Vec<_>>();
    let in_loops = (tape.slots())
        .filter(|s| plan.grads.in_loops.get(s.index()))
        .count();
    let stored: Vec<usize> = (0..tape.len())
        .filter(|&s| plan.grads.stored_slot(s as i64))
        .collect();
    // Every gradient a loop adds into is stored by its first addition but those of the
    // steps the nest does not cover (the first and the last may differ).
    assert!(in_loops > 8 * 40 * 5, "{in_loops} slots in loops");
    let zeroed = zeroed.iter().filter(|&&z| z).count();
    assert!(zeroed <= 8 * 5 * 4, "{zeroed} of {in_loops} zeroed");
    // Among them the state, which three nodes of the next step read.
    let args: Vec<crate::tape::Slot> = tape.slots().flat_map(|s| tape.args(s).to_vec()).collect();
    let used_thrice = stored
        .iter()
        .filter(|&&s| args.iter().filter(|a| a.index() == s).count() >= 3)
        .count();
    assert!(
        used_thrice >= 8 * 30,
        "{used_thrice} stored slots read 3 times or more"
    );
}

#[test]
fn a_layers_inputs_summed_by_every_neuron_start_from_zero_not_zeroed() {
    let (tape, whole, zeroed) = marked_slots(3, GradMemory::sums_whole);
    // The first layer's 16 outputs in each copy: the second layer's 16 neurons add into
    // each, in one vertical block, and nothing else does.
    assert_eq!(whole.len(), 5 * 16, "{whole:?}");
    for &s in &whole {
        assert!(!zeroed[s], "slot {s} sums from 0 and is zeroed");
        assert_eq!(tape.op(crate::tape::Slot(s as u32)), crate::op::Op::Relu);
    }
}

#[test]
fn train_skips_the_zero_inputs_of_its_merged_layer_guarding_exactly_its_weights() {
    let g = Graph::new();
    Classifier::new(&g, 20, &[12], 3, &mut StdRng::seed_from_u64(8)).unwrap();
    for (when, always) in [(ZeroSkipping::Auto, false), (ZeroSkipping::Always, true)] {
        let (tape, plan) = planned_with(&g, when);
        let train = plan.step.as_ref().and_then(|s| s.train.as_ref()).unwrap();
        let skip = train
            .skip_zeros
            .as_ref()
            .expect("the merged layer skips zeros");
        assert_eq!(skip.always, always);
        let guarded: Vec<u32> = skip.weights.iter().cloned().flatten().collect();
        // The first layer's 12 x 20 weights (moved input-major), not its biases.
        assert_eq!(guarded.len(), 12 * 20);
        let params = tape.num_params() as u32;
        assert!(guarded.iter().all(|&s| s < params));
        assert!(guarded.windows(2).all(|w| w[0] < w[1]));
    }
    let (_, plan) = planned_with(&g, ZeroSkipping::Never);
    let train = plan.step.as_ref().and_then(|s| s.train.as_ref()).unwrap();
    assert_eq!(train.skip_zeros, None);
}

#[test]
fn buffers_hold_kept_slots_side_by_side_where_loops_stay_affine() {
    use super::Buffers;
    use crate::passes::schedule::{Affine, MapLoop, MAX_NEST_DEPTH};
    use crate::tape::Slot;
    // A param and an input, then 12 nodes (slots 2..14).
    let g = Graph::new();
    let (p, x) = (g.param(0.5), g.input());
    let mut v = p * x;
    for _ in 0..11 {
        v *= p;
    }
    g.set_loss(v).unwrap();
    let tape = Tape::from_graph(&g).unwrap();
    assert_eq!(tape.len(), 14);
    // A loop reading slots 2, 5 and 8 and writing 11, 12 and 13.
    let at = |base, stride| Affine {
        base,
        stride,
        outer: [0; MAX_NEST_DEPTH],
    };
    let items = vec![Item::Map(MapLoop {
        op: crate::op::Op::Neg,
        out: at(11, 1),
        args: vec![at(2, 3)],
        len: 3,
        needs_grad: false,
        grad_args: vec![false],
    })];
    let kept = |unkept: &[usize]| super::PerSlot::from_fn(14, None, |s| !unkept.contains(&s));
    // One slot not kept after each read: the reads stay affine, 2 addresses apart.
    let regular = Buffers::new(&tape, &kept(&[3, 6, 9]), &items, None);
    assert_eq!(regular.buffer_len(), 11);
    assert!((0..2).all(|s| regular.address(Slot(s)) == s as usize));
    assert_eq!(regular.affine(at(2, 3)), at(2, 2));
    assert_eq!(regular.affine(at(11, 1)), at(8, 1));
    // Two after the first read only: addresses 2, 3, 6, not affine: slot by slot.
    let irregular = Buffers::new(&tape, &kept(&[3, 4]), &items, None);
    assert_eq!(irregular.buffer_len(), 14);
    assert!(irregular.in_place());
}

/// A layer whose rows of weights are not whole cache lines (13 neurons: rows of 13
/// weights, input-major) gets rows of 16, each starting on a line, params first and the
/// inputs right after them; rows of 10 (a line and a quarter, lined would waste more than a
/// quarter) and of 16 (whole lines already) keep their length. The loops stay affine.
#[test]
fn a_layers_rows_start_on_cache_lines() {
    const NIN: usize = 24;
    for (hidden, row) in [(13, 16), (10, 10), (16, 16)] {
        let g = Graph::new();
        Classifier::new(&g, NIN, &[hidden], 3, &mut StdRng::seed_from_u64(4)).unwrap();
        let tape = Tape::from_graph(&g).unwrap();
        let s = schedule(&tape, true);
        let (tape, s) = layout::apply(tape, s).unwrap();
        let kept = super::buffers::kept(&tape, &s.items, None);
        let b = super::Buffers::new(&tape, &kept, &s.items, None);
        let p = tape.num_params();
        // The first layer's weights: input-major after the layout pass, the first
        // input's weight for every neuron, then the next input's. Where do they start?
        let rows_from = |s: usize| {
            let at = |k: usize| b.address(Slot((s + k) as u32));
            (0..NIN).all(|r| (0..hidden).all(|c| at(r * hidden + c) == at(0) + r * row + c))
        };
        let first = (0..=p - NIN * hidden)
            .find(|&s| rows_from(s))
            .unwrap_or_else(|| {
                panic!(
                    "hidden {hidden}: {:?}",
                    (0..p)
                        .map(|s| b.address(Slot(s as u32)))
                        .collect::<Vec<_>>()
                )
            });
        let at = |k: usize| b.address(Slot((first + k) as u32));
        if row != hidden || hidden % 8 == 0 {
            assert_eq!(at(0) % 8, 0, "hidden {hidden}: rows start on a line");
        }
        let addresses: Vec<usize> = (0..p).map(|s| b.address(Slot(s as u32))).collect();
        assert!(
            addresses.windows(2).all(|w| w[0] < w[1]),
            "params keep their order"
        );
        let inputs = b.params_len(&tape);
        assert!(addresses.iter().all(|&a| a < inputs));
        let input_addresses: Vec<usize> = (0..tape.num_inputs())
            .map(|i| b.address(Slot((tape.input_base() + i) as u32)))
            .collect();
        assert_eq!(
            input_addresses,
            (inputs..inputs + NIN + 3).collect::<Vec<_>>()
        );
        if row != hidden {
            assert_eq!(inputs % 8, 0, "inputs start on a line");
            assert_eq!(at(NIN * hidden - 1), at(0) + (NIN - 1) * row + hidden - 1);
        }
        // Zeroing or updating every param walks one run, gaps and all; leaving the first
        // layer's weights out leaves their gaps out too.
        let every = b.compact_bridged(&tape, p, |_| true);
        let lined_end = at(NIN * hidden - 1) + 1;
        assert!(every[..lined_end].iter().all(|&x| x), "hidden {hidden}");
        let mut but_weights = vec![true; p];
        but_weights[first..first + NIN * hidden].fill(false);
        let some = b.compact_bridged(&tape, p, |s| but_weights[s]);
        assert!(
            some[at(0)..lined_end].iter().all(|&x| !x),
            "hidden {hidden}"
        );
    }
}

/// A nest inside copies is checked for lanes in the first copy alone where every copy is the
/// first moved (params shared, the copy's own values at its stride): the decisions match
/// checking every copy. Among the graphs, copies that read their neighbour's values (their
/// slots meet another copy's), where the first copy cannot decide for the others.
#[test]
fn lanes_decided_in_the_first_repetition_match_checking_every_one() {
    let neighbours = |g: &Graph| {
        let mut rng = StdRng::seed_from_u64(3);
        let layer = Layer::new(g, 12, 12, Activation::Tanh, &mut rng);
        let mut x = g.inputs(12);
        let mut terms = Vec::new();
        for _ in 0..6 {
            let y = layer.call(&x).unwrap();
            // The next copy reads this one's outputs, shifted by one.
            x = (0..12).map(|i| y[(i + 1) % 12] + x[i]).collect();
            terms.extend(y);
        }
        g.set_loss(g.sum(&terms)).unwrap();
    };
    let builders: [&dyn Fn(&Graph); 4] = [
        &|g| copies_of_two_layers(g, 5),
        &|g| rollout(g, 8, 40),
        &|g| rollout(g, 16, 12),
        &neighbours,
    ];
    for (k, build) in builders.iter().enumerate() {
        let g = Graph::new();
        build(&g);
        let tape = Tape::from_graph(&g).unwrap();
        let s = schedule(&tape, true);
        let (tape, s) = layout::apply(tape, s).unwrap();
        let kept = super::buffers::kept(&tape, &s.items, None);
        let buffers = super::Buffers::new(&tape, &kept, &s.items, None);
        let (mut once, mut each) = (Vec::new(), Vec::new());
        let (mut nests_once, mut nests_each) = (Nests::new(s.nests), Nests::new(s.nests));
        for item in &s.items {
            super::lanes::decide(item, &buffers, &mut nests_once);
            super::lanes::decide_checking_every_repetition(item, &buffers, &mut nests_each);
            collect_lanes(&nests_once, item, &mut once);
            collect_lanes(&nests_each, item, &mut each);
        }
        assert_eq!(once, each, "graph {k}");
        assert!(!once.is_empty(), "graph {k} has no nests");
    }
}

#[test]
fn recovered_loops_are_loop_code_and_straight_line_tapes_are_not() {
    use super::functions::{loop_code, LOOP_CODE_STRAIGHT};
    let g = Graph::new();
    copies_of_two_layers(&g, 3);
    for recover in [true, false] {
        let (tape, plan) = planned_recovering(&g, ZeroSkipping::Auto, recover);
        assert!(tape.len() > 10 * LOOP_CODE_STRAIGHT);
        assert_eq!(loop_code(&plan.functions), recover);
        // Each function alone: all loops, or (some of) the straight line.
        let loops = plan.functions.iter().filter(|f| loop_code([*f])).count();
        assert_eq!(loops == plan.functions.len(), recover);
    }
}

#[test]
fn slp_pays_on_a_layer_written_out_not_on_a_random_graph() {
    use super::functions::slp_pays;
    use rand::Rng;
    let plan_of = |g: &Graph, recover| planned_recovering(g, ZeroSkipping::Auto, recover);
    // Two layers written out node by node (loop recovery off): products of the next weight
    // and the next input side by side.
    let layers = Graph::new();
    copies_of_two_layers(&layers, 4);
    let (tape, plan) = plan_of(&layers, false);
    assert!(slp_pays(&tape, &plan.functions));
    // Random operations on random earlier values: no loop, and no two neighbours alike.
    let random = Graph::new();
    let mut rng = StdRng::seed_from_u64(9);
    let mut values: Vec<Value> = random.inputs(8);
    values.extend((0..8).map(|_| random.param(rng.gen_range(-1.0..1.0))));
    for _ in 0..3000 {
        let a = values[rng.gen_range(0..values.len())];
        let b = values[rng.gen_range(0..values.len())];
        values.push(match rng.gen_range(0..4) {
            0 => a + b,
            1 => a * b,
            2 => a - b,
            _ => (a * 0.5).tanh(),
        });
    }
    random
        .set_loss(random.sum(&values[values.len() - 64..]))
        .unwrap();
    let (tape, plan) = plan_of(&random, true);
    assert!(plan.loops == 0 && tape.len() > 1000, "{} loops", plan.loops);
    assert!(!slp_pays(&tape, &plan.functions));
}

/// The forward order of every nest in `plan`, with its count and its body's kinds.
fn forward_orders(plan: &Plan) -> Vec<(u32, Vec<&'static str>, Vec<u32>)> {
    fn visit(plan: &Plan, item: &Item, out: &mut Vec<(u32, Vec<&'static str>, Vec<u32>)>) {
        if let Item::Nest(n) = item {
            let kinds = n.body.iter().map(|b| match b {
                Item::Nest(_) => "nest",
                Item::Dot(_) => "dot",
                Item::Map(_) => "map",
                Item::Sum(_) => "sum",
                _ => "other",
            });
            out.push((n.count, kinds.collect(), plan.nest(n).forward_order.clone()));
            n.body.iter().for_each(|b| visit(plan, b, out));
        }
    }
    let mut out = Vec::new();
    plan.functions
        .iter()
        .flatten()
        .for_each(|i| visit(plan, i, &mut out));
    out
}

/// A rollout's forward runs first what the next step reads: an RNN's cell before the
/// readout of the state the cell reads too (the tape has the readout first in the nest's
/// repetition: the first step, which reads constants, stands outside it).
#[test]
fn a_rollouts_forward_runs_the_chain_to_the_next_step_first() {
    for readout in [false, true] {
        let g = Graph::new();
        recurrent_cells(&g, 16, readout);
        let (_, plan) = planned(&g);
        let orders = forward_orders(&plan);
        let reordered: Vec<_> = orders.iter().filter(|o| !o.2.is_empty()).collect();
        match readout {
            false => assert!(reordered.is_empty(), "{orders:?}"),
            true => {
                assert_eq!(reordered.len(), 1, "{orders:?}");
                let (_, kinds, order) = reordered[0];
                assert_eq!(kinds[order[0] as usize], "nest", "{orders:?}");
                assert_eq!(kinds[*order.last().unwrap() as usize], "dot", "{orders:?}");
            }
        }
    }
}

/// What the chain reads in the same step stays before it; what it does not moves after it.
#[test]
fn a_rollouts_chain_keeps_what_it_reads_before_it() {
    let g = Graph::new();
    let mut h = g.input();
    let mut terms = Vec::new();
    for _ in 0..40 {
        terms.push(h * 2.0);
        let a = h * 3.0;
        h = (a + 0.5).tanh();
    }
    terms.push(h);
    g.set_loss(g.sum(terms.iter().map(|&t| t * t))).unwrap();
    let (_, plan) = planned(&g);
    let orders = forward_orders(&plan);
    let reordered: Vec<_> = orders.iter().filter(|o| !o.2.is_empty()).collect();
    assert_eq!(reordered.len(), 1, "{orders:?}");
    // The step's `h * 2` (only the loss reads it) after `h * 3`, `+ 0.5` and `tanh`.
    assert_eq!(reordered[0].2, [1, 2, 3, 0], "{orders:?}");
}

/// A chain of `n` masses on springs in one dimension over `steps` steps, written as the
/// springs family is: spring 0 ties mass 0 to a wall (a constant), spring `s` masses `s - 1`
/// and `s`; mass `i` feels springs `i` and `i + 1`, the last one spring `i` only. So both
/// ends of the chain differ from its inside.
fn chain(g: &Graph, n: usize, steps: usize) {
    let k: Vec<Value> = (0..n).map(|i| g.param(1.0 + 0.1 * i as f64)).collect();
    let mut x = g.inputs_without_grad(n);
    let mut v = g.inputs_without_grad(n);
    let wall = g.constant(0.0);
    for _ in 0..steps {
        let tension: Vec<Value> = (0..n)
            .map(|s| {
                let left = if s == 0 { wall } else { x[s - 1] };
                let stretch = x[s] - left;
                k[s] * (stretch - 1.0)
            })
            .collect();
        let (mut x2, mut v2) = (Vec::new(), Vec::new());
        for i in 0..n {
            let force = match i + 1 < n {
                true => tension[i + 1] - tension[i],
                false => -tension[i],
            };
            x2.push(x[i] + v[i] * 0.1);
            v2.push(v[i] + force * 0.1);
        }
        (x, v) = (x2, v2);
    }
    g.set_loss(g.sum(x.iter().map(|&p| p * p))).unwrap();
}

/// The flat nests of `items` at any depth, with the level of their repetitions.
fn flat_nests(items: &[Item]) -> Vec<(&crate::passes::schedule::Nest, usize)> {
    fn visit<'a>(
        item: &'a Item,
        level: usize,
        out: &mut Vec<(&'a crate::passes::schedule::Nest, usize)>,
    ) {
        let Item::Nest(nest) = item else { return };
        if nest.body.iter().any(|b| matches!(b, Item::Nest(_))) {
            nest.body.iter().for_each(|b| visit(b, level + 1, out));
        } else {
            out.push((nest, level));
        }
    }
    let mut out = Vec::new();
    items.iter().for_each(|i| visit(i, 0, &mut out));
    out
}

/// A chain's springs and masses run in lanes, backward too: the spring at the wall and the
/// last mass lie in the buffers as one more repetition of the nest beside them, so every
/// slot the nests read or write lies side by side across the lanes (or is one for all of
/// them), and the spring `x[s] - x[s - 1]` adds into its operands from the last, which
/// reaches each mass from the spring after it first, as the interpreter does.
#[test]
fn a_chains_ends_join_its_nests_in_the_buffers_and_its_links_add_from_the_last_operand() {
    let g = Graph::new();
    chain(&g, 12, 20);
    let (_, plan) = planned(&g);
    let items: Vec<Item> = plan.functions.iter().flatten().cloned().collect();
    let nests = flat_nests(&items);
    let inner: Vec<_> = nests.iter().filter(|(_, level)| *level == 1).collect();
    // In each step: the 11 springs between masses, the 11 masses with a spring after them.
    assert_eq!(inner.len(), 2, "{nests:?}");
    for (nest, level) in &inner {
        assert_eq!(nest.count, 11);
        let lanes = plan.nest(nest).lanes;
        assert!(lanes.backward().is_some(), "{lanes:?}");
        for access in nest.body.iter().flat_map(Item::accesses) {
            let across = plan.buffers.affine(access.at).outer[*level];
            assert!(matches!(across, 0 | 1), "{access:?}: {across} apart");
        }
    }
    let from_last: Vec<Vec<bool>> = inner
        .iter()
        .map(|(nest, _)| {
            let maps = (nest.body.iter().enumerate()).filter_map(|(k, item)| match item {
                Item::Map(_) => Some(plan.nest(nest).adds_from_last(k)),
                _ => None,
            });
            maps.collect()
        })
        .collect();
    // Each nest's first map, the spring's stretch and the mass's force (`tension[i + 1] -
    // tension[i]`), whose later operand the repetition before also reads; no other.
    assert_eq!(
        from_last,
        [
            vec![true, false, false],
            vec![true, false, false, false, false]
        ],
        "{inner:?}"
    );
    // Within a step, a spring's stretch and its force's factor, and a mass's force and its
    // velocity's increment, are read and take gradients from its own repetition only: in
    // lanes too they stay in the scratch, a vector per lane group.
    for (nest, _) in &inner {
        let locals = |locals: &super::local::Locals| {
            (nest.body.iter())
                .filter(|item| matches!(item, Item::Map(m) if locals.place(m.out).is_some()))
                .count()
        };
        assert!(locals(&plan.grads.local) >= 2, "{nest:?}");
        assert!(locals(&plan.local_values) >= 1, "{nest:?}");
    }
    // The buffers know where the ends lie beside each nest's lanes (so that the links'
    // vectors start where the nest's own do): never within the lanes, and beside some of
    // them (the spring at the wall before the springs, the last mass after the masses).
    for (nest, level) in &inner {
        let count = nest.count as i64;
        let lanes: Vec<i64> = (nest.body.iter())
            .filter_map(|item| match item {
                Item::Map(m) => Some(plan.buffers.affine(m.out)),
                _ => None,
            })
            .filter(|out| out.outer[*level] == 1)
            .map(|out| out.base)
            .collect();
        let is_end = |a: i64| plan.buffers.is_end(a);
        assert!(lanes.iter().all(|&a| (a..a + count).all(|a| !is_end(a))));
        assert!(
            lanes.iter().any(|&a| is_end(a - 1) || is_end(a + count)),
            "{nest:?}"
        );
    }
}

/// A classifier on inputs without gradient, skipping zero inputs: minibatches can cut its
/// first layer by rows ([`super::split`]), whose weights are one block of lined rows (13
/// neurons, rows of 16) with no other param in it, whose sums lie side by side and whose
/// inputs are the sample's first. Not where `train` does not skip zeros, nor where the
/// first layer's inputs take a gradient.
#[test]
fn a_first_layer_on_inputs_is_cut_by_rows() {
    const NIN: usize = 24;
    let g = Graph::new();
    Classifier::new(&g, NIN, &[13], 3, &mut StdRng::seed_from_u64(4)).unwrap();
    let (tape, plan) = planned(&g);
    let split = plan.split.clone().expect("the first layer splits");
    assert_eq!(
        (split.rows, split.row_stride, split.first_input),
        (NIN, 16, 0)
    );
    assert_eq!(split.sums.len(), 13);
    let block = split.weights(0..NIN);
    let inside = (0..tape.num_params())
        .filter(|&p| block.contains(&plan.buffers.address(Slot(p as u32))))
        .count();
    assert_eq!(
        inside,
        NIN * 13,
        "the block holds the layer's weights and nothing else"
    );
    assert_eq!(split.weights(2..5).len(), 3 * 16);

    let (_, never) = planned_with(&g, ZeroSkipping::Never);
    assert!(never.split.is_none(), "without zero-skipping");

    let g = Graph::new();
    let layer = Layer::new(&g, NIN, 13, Activation::Relu, &mut StdRng::seed_from_u64(4));
    let out = layer.call(&g.inputs(NIN)).unwrap();
    let loss = out.iter().fold(g.constant(0.0), |acc, &h| acc + h * h);
    g.set_loss(loss).unwrap();
    let (_, plan) = planned(&g);
    assert!(plan.split.is_none(), "inputs that take a gradient");
}

/// A nest over a batch's copies is checked in its first two repetitions (the others follow,
/// [`super::verify`]): a read or write moved wrongly per copy, or a copy too many, is found
/// all the same.
#[test]
fn a_nest_over_copies_that_misses_a_copy_is_refused() {
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(2);
    let layer = Layer::new(&g, 3, 6, Activation::Tanh, &mut rng);
    let outs: Vec<_> = (0..7)
        .map(|_| g.sum(&layer.call(&g.inputs_without_grad(3)).unwrap()))
        .collect();
    g.set_loss(g.sum(&outs) * (1.0 / 7.0)).unwrap();
    let (tape, plan) = planned(&g);
    let copies = tape.copies().expect("seven copies").clone();
    let tampered = |change: &dyn Fn(&mut Nest)| {
        let mut plan = plan.clone();
        let nest = (plan.functions.iter_mut().flatten())
            .find_map(|i| match i {
                Item::Nest(n) if n.count == copies.count => Some(n),
                _ => None,
            })
            .expect("the copies' nest");
        change(nest);
        plan.verify(&tape)
    };
    assert!(tampered(&|_| {}).is_ok());
    // A read of the inputs moving one slot too few per copy (a copy reads its neighbour's).
    let read_wrongly = |n: &mut Nest| {
        let mut inputs = 0;
        n.body = (n.body.iter())
            .map(|b| {
                b.map_affines(&mut |mut a, _| {
                    if a.outer[0] == 3 && inputs == 0 {
                        inputs += 1;
                        a.outer[0] = 2;
                    }
                    a
                })
            })
            .collect();
    };
    assert!(tampered(&read_wrongly).is_err());
    // One copy too few, or too many.
    assert!(tampered(&|n| n.count -= 1).is_err());
    assert!(tampered(&|n| n.count += 1).is_err());
}

/// `count` copies of a `nin`-`hidden`-`nout` MLP sharing params, each on inputs of its own,
/// the loss their softmax cross-entropies' mean (a minibatch written as copies); the copies
/// `shown` show their logits.
fn minibatch_as_copies(g: &Graph, count: usize, sizes: [usize; 3], shown: &[usize]) {
    let mut rng = StdRng::seed_from_u64(11);
    let hidden = Layer::new(g, sizes[0], sizes[1], Activation::Relu, &mut rng);
    let readout = Layer::new(g, sizes[1], sizes[2], Activation::Linear, &mut rng);
    let mut losses = Vec::new();
    for b in 0..count {
        let x = g.inputs_without_grad(sizes[0]);
        let target = g.inputs_without_grad(sizes[2]);
        let logits = readout.call(&hidden.call(&x).unwrap()).unwrap();
        if shown.contains(&b) {
            for &y in &logits {
                g.add_output(y).unwrap();
            }
        }
        losses.push(crate::nn::softmax_cross_entropy(&logits, &target).unwrap());
    }
    g.set_loss(g.sum(&losses) * (1.0 / count as f64)).unwrap();
}

/// `count` copies of one tanh neuron on 12 inputs of its own, squared and summed: copies
/// whose body holds no nest, so the buffers lay their values out across the copies.
fn copies_of_a_neuron(g: &Graph, count: usize) {
    let mut rng = StdRng::seed_from_u64(12);
    let neuron = Layer::new(g, 12, 1, Activation::Tanh, &mut rng);
    let scale = g.param(0.5).exp();
    let terms: Vec<Value<'_>> = (0..count)
        .map(|_| {
            let y = neuron.call(&g.inputs_without_grad(12)).unwrap()[0] * scale;
            y * y
        })
        .collect();
    g.set_loss(g.sum(&terms)).unwrap();
}

/// `count` copies of a rollout of 12 steps over a ring of 6 values (each the tanh of its
/// own and its neighbour's, weighted by params every copy shares), from inputs of the copy's
/// own that take a gradient: steps nested in copies, whose state loops store whole.
fn copies_of_a_rollout(g: &Graph, count: usize) {
    let (w, v) = (g.param(0.7), g.param(-0.4));
    let mut terms = Vec::new();
    for _ in 0..count {
        let mut x = g.inputs(6);
        for _ in 0..12 {
            x = (0..6)
                .map(|i| (x[i] * w + x[(i + 1) % 6] * v).tanh())
                .collect();
        }
        terms.push(g.sum(&x));
    }
    g.set_loss(g.sum(&terms) * (1.0 / count as f64)).unwrap();
}

/// A batch's copies stored once (copies `2..` ruled by copies 0 and 1, `PerSlot`) plan as
/// storing every slot does: the same kept slots, addresses, per-address masks and places
/// of the gradients.
#[test]
fn copies_stored_once_plan_as_storing_every_slot() {
    type Build<'a> = &'a dyn Fn(&Graph);
    // (Whether the copies run alike: not where one copy shows a value the others do not.)
    let builders: [(&str, Build, bool); 7] = [
        ("rollouts", &|g| copies_of_a_rollout(g, 5), true),
        (
            "minibatch",
            &|g| minibatch_as_copies(g, 6, [12, 5, 3], &[]),
            true,
        ),
        (
            "wider",
            &|g| minibatch_as_copies(g, 9, [20, 10, 4], &[]),
            true,
        ),
        (
            "one copy shown",
            &|g| minibatch_as_copies(g, 6, [12, 5, 3], &[3]),
            false,
        ),
        (
            "all shown",
            &|g| minibatch_as_copies(g, 6, [12, 5, 3], &[0, 1, 2, 3, 4, 5]),
            true,
        ),
        ("a neuron", &|g| copies_of_a_neuron(g, 7), true),
        ("two layers", &|g| copies_of_two_layers(g, 5), false),
    ];
    let options = PlanOptions {
        chunk_size: 250,
        fast_math: false,
        zero_skipping: ZeroSkipping::Auto,
        host_avx512: false,
    };
    for (name, build, runs_alike) in builders {
        let g = Graph::new();
        build(&g);
        let tape = Tape::from_graph(&g).unwrap();
        let s = schedule(&tape, true);
        let (tape, s) = layout::apply(tape, s).unwrap();
        let copies = super::CopiesRunAlike::of(&tape, &s.items);
        assert_eq!(copies.is_some(), runs_alike, "{name}");
        let once = Plan::with_copies(&tape, &s, options, copies).unwrap();
        let every = Plan::with_copies(&tape, &s, options, None).unwrap();
        assert_eq!(once.copies, copies, "{name}");
        let (a, b) = (&once.buffers, &every.buffers);
        assert_eq!(a.buffer_len(), b.buffer_len(), "{name}");
        assert_eq!(a.in_place(), b.in_place(), "{name}");
        for s in tape.slots() {
            assert_eq!(
                once.kept.get(s.index()),
                every.kept.get(s.index()),
                "{name}: {s:?}"
            );
            assert_eq!(a.address(s), b.address(s), "{name}: {s:?}");
        }
        let grad = |s: usize| tape.needs_grad(Slot(s as u32));
        assert_eq!(
            a.compact_bridged(&tape, tape.len(), grad),
            b.compact_bridged(&tape, tape.len(), grad),
            "{name}"
        );
        // The decisions that are not per slot are the same.
        assert_eq!(once.functions, every.functions, "{name}");
        assert_eq!(once.step, every.step, "{name}");
        // Where the gradients live, and which values and gradients stay in registers.
        let (g, h) = (&once.grads, &every.grads);
        assert_eq!(g.local.count(), h.local.count(), "{name}");
        assert_eq!(
            once.local_values.count(),
            every.local_values.count(),
            "{name}"
        );
        for s in tape.slots() {
            assert_eq!(g.local.is_local(s), h.local.is_local(s), "{name}: {s:?}");
            let values = (&once.local_values, &every.local_values);
            assert_eq!(values.0.is_local(s), values.1.is_local(s), "{name}: {s:?}");
            for step in [false, true] {
                assert_eq!(
                    g.zeroed(&tape, s, step),
                    h.zeroed(&tape, s, step),
                    "{name}: {s:?}"
                );
            }
            for f in 0..once.functions.len() {
                assert_eq!(
                    g.start(&tape, s, f, false),
                    h.start(&tape, s, f, false),
                    "{name}"
                );
            }
            assert_eq!(
                g.stored_slot(s.0 as i64),
                h.stored_slot(s.0 as i64),
                "{name}"
            );
            assert_eq!(
                g.unstored(&tape, &once.kept, once.step.as_ref(), s.index()),
                h.unstored(&tape, &every.kept, every.step.as_ref(), s.index()),
                "{name}: {s:?}"
            );
        }
    }
}

/// A sum over the copies cut into parts (functions too small for it) reads some copies in
/// one function and the others in the next: the copies no longer run alike there.
#[test]
fn copies_read_by_a_sum_in_parts_do_not_run_alike() {
    let g = Graph::new();
    copies_of_a_neuron(&g, 7);
    let tape = Tape::from_graph(&g).unwrap();
    let s = schedule(&tape, true);
    let copies = super::CopiesRunAlike::of(&tape, &s.items).expect("copies run alike");
    // The loss: the sum of the copies' squares.
    let sum = tape.loss().unwrap();
    assert_eq!(tape.op(sum), crate::op::Op::Sum);
    let functions = |item| vec![vec![item]];
    let part = Item::SumPart {
        slot: sum,
        args: 0..3,
    };
    assert_eq!(copies.in_functions(&tape, &functions(part)), None);
    assert_eq!(
        copies.in_functions(&tape, std::slice::from_ref(&s.items)),
        Some(copies)
    );
}
