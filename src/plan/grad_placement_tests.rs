//! `Plan::verify`'s check of where backward's gradients live ([`super::verify_grads`]): real
//! plans of every shape pass it, and each answer of [`super::GradMemory`] (or
//! [`super::StepPlan`]) tampered with the way a wrong planner would is refused, naming the
//! slot.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::memory::Addition;
use super::{Plan, PlanOptions, ZeroSkipping};
use crate::nn::{Activation, Classifier, Layer};
use crate::passes::layout;
use crate::passes::loops::schedule;
use crate::passes::schedule::{Item, MapLoop};
use crate::plan::Lanes;
use crate::tape::Slot;
use crate::{Graph, Tape, Value};

/// `g`'s tape after the JIT's param layout and its plan (verified), loops recovered or not,
/// in functions of about `chunk_size` nodes.
fn planned(g: &Graph, recover: bool, chunk_size: usize) -> (Tape, Plan) {
    let tape = Tape::from_graph(g).unwrap();
    let s = schedule(&tape, recover);
    let (tape, s) = layout::apply(tape, s).unwrap();
    let options = PlanOptions {
        chunk_size,
        fast_math: false,
        zero_skipping: ZeroSkipping::Auto,
        host_avx512: false,
    };
    let plan = Plan::new(&tape, &s, options).unwrap();
    (tape, plan)
}

/// The error `Plan::verify` gives `plan` after `tamper`.
fn refused(tape: &Tape, plan: &Plan, tamper: impl FnOnce(&mut Plan)) -> String {
    let mut tampered = plan.clone();
    tamper(&mut tampered);
    assert_ne!(&tampered, plan, "nothing tampered with");
    tampered
        .verify(tape)
        .expect_err("a tampered plan")
        .to_string()
}

/// Asserts `error` is about gradient placement at `slot`, saying `what`.
#[track_caller]
fn assert_refused(error: &str, slot: usize, what: &str) {
    let at = format!("at slot {slot}:");
    assert!(error.contains(&at) && error.contains(what), "{error}");
}

/// A classifier `nin`-`hidden`-3 (relu layers, softmax cross-entropy) on inputs without
/// gradient: `step` fuses its first layer's weight updates.
fn classifier(g: &Graph, nin: usize, hidden: &[usize]) {
    Classifier::new(g, nin, hidden, 3, &mut StdRng::seed_from_u64(8)).unwrap();
}

/// Five copies of a 2-16-16 MLP sharing params (micrograd's moons demo's shape): the first
/// layer's outputs sum their gradients from 0 in the second layer's vertical blocks.
fn copies_of_two_layers(g: &Graph) {
    let mut rng = StdRng::seed_from_u64(3);
    let l1 = Layer::new(g, 2, 16, Activation::Relu, &mut rng);
    let l2 = Layer::new(g, 16, 16, Activation::Relu, &mut rng);
    let mut terms = Vec::new();
    for _ in 0..5 {
        let x = g.inputs(2);
        terms.extend(l2.call(&l1.call(&x).unwrap()).unwrap());
    }
    g.set_loss(g.sum(&terms)).unwrap();
}

/// `count` copies of a `nin`-`hidden`-3 MLP sharing params, on inputs of their own without
/// gradient, the loss their cross-entropies' mean (a minibatch written as copies).
fn minibatch_as_copies(g: &Graph, count: usize, nin: usize, hidden: usize) {
    let mut rng = StdRng::seed_from_u64(11);
    let hidden = Layer::new(g, nin, hidden, Activation::Relu, &mut rng);
    let readout = Layer::new(g, hidden.neurons.len(), 3, Activation::Linear, &mut rng);
    let losses: Vec<Value> = (0..count)
        .map(|_| {
            let x = g.inputs_without_grad(nin);
            let target = g.inputs_without_grad(3);
            let logits = readout.call(&hidden.call(&x).unwrap()).unwrap();
            crate::nn::softmax_cross_entropy(&logits, &target).unwrap()
        })
        .collect();
    g.set_loss(g.sum(&losses) * (1.0 / count as f64)).unwrap();
}

/// `count` copies of a rollout of 12 steps over a ring of 6 values, from inputs of the
/// copy's own that take a gradient (read before the copies at a stride of their own).
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

/// A rollout of `steps` steps over `n` elements, each read by three nodes of the next step:
/// its state is stored by its first addition.
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

/// A chain of `n` masses on springs over `steps` steps (tests.rs's `chain`): nests in lanes
/// whose links add from their last operand, and locals.
fn chain(g: &Graph, n: usize, steps: usize) {
    let k: Vec<Value> = (0..n).map(|i| g.param(1.0 + 0.1 * i as f64)).collect();
    let mut x = g.inputs_without_grad(n);
    let mut v = g.inputs_without_grad(n);
    let wall = g.constant(0.0);
    for _ in 0..steps {
        let tension: Vec<Value> = (0..n)
            .map(|s| {
                let left = if s == 0 { wall } else { x[s - 1] };
                k[s] * ((x[s] - left) - 1.0)
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

/// An Elman cell of `hidden` state values over 6 steps, with a readout of every state.
fn recurrent_cells(g: &Graph, hidden: usize) {
    let mut rng = StdRng::seed_from_u64(hidden as u64);
    let cell = Layer::new(g, 3 + hidden, hidden, Activation::Tanh, &mut rng);
    let out = Layer::new(g, hidden, 1, Activation::Linear, &mut rng);
    let mut h: Vec<Value> = g.inputs(hidden);
    let mut terms = Vec::new();
    for _ in 0..6 {
        let mut xh = g.inputs_without_grad(3);
        xh.extend(&h);
        h = cell.call(&xh).unwrap();
        terms.extend(out.call(&h).unwrap());
    }
    terms.extend(&h);
    g.set_loss(g.sum(terms.iter().map(|&t| t * t))).unwrap();
}

/// A random irregular graph of about `nodes` nodes over 8 params and 8 inputs, its unread
/// values summed into the loss by one wide `sum`, and one value shown as an output.
fn random_graph(g: &Graph, nodes: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pool: Vec<Value> = g.inputs(8);
    pool.extend((0..8).map(|_| g.param(rng.gen_range(-1.0..1.0))));
    let mut read = vec![false; pool.len()];
    while g.len() < nodes {
        let n = pool.len();
        let mut pick = |rng: &mut StdRng| {
            let i = rng.gen_range(n.saturating_sub(40)..n);
            read[i] = true;
            pool[i]
        };
        let (a, b) = (pick(&mut rng), pick(&mut rng));
        let v = match rng.gen_range(0..5) {
            0 => a + b,
            1 => a * b.tanh(),
            2 => (a - b).tanh(),
            3 => a * 0.5,
            _ => a.sigmoid() * b,
        };
        pool.push(v);
        read.push(false);
    }
    g.add_output(pool[pool.len() / 2]).unwrap();
    let unread: Vec<Value> = (pool.iter().zip(&read))
        .filter(|(_, &r)| !r)
        .map(|(&v, _)| v)
        .collect();
    g.set_loss(g.sum(&unread)).unwrap();
}

/// Every real plan places each gradient where it is read: graphs of every shape, loops
/// recovered or not, in large and small functions (a wide sum cut into parts). `Plan::new`
/// verifies each; here the plans are also seen to hold what the check walks.
#[test]
fn real_plans_place_every_gradient_where_it_is_read() {
    type Build<'a> = &'a dyn Fn(&Graph);
    let builders: [(&str, Build); 9] = [
        ("classifier", &|g| classifier(g, 20, &[12])),
        ("deep classifier", &|g| classifier(g, 16, &[10, 9])),
        ("two layers", &copies_of_two_layers),
        ("minibatch", &|g| minibatch_as_copies(g, 6, 12, 5)),
        ("rollouts", &|g| copies_of_a_rollout(g, 5)),
        ("rollout", &|g| rollout(g, 8, 40)),
        ("chain", &|g| chain(g, 12, 20)),
        ("recurrent", &|g| recurrent_cells(g, 16)),
        ("random", &|g| random_graph(g, 3000, 1)),
    ];
    let (mut step, mut alike, mut locals, mut stored, mut summed, mut parts) = (0, 0, 0, 0, 0, 0);
    for (name, build) in builders {
        let g = Graph::new();
        build(&g);
        for (recover, chunk_size) in [(true, 250), (true, 40), (false, 60)] {
            let (tape, plan) = planned(&g, recover, chunk_size);
            super::verify_grads::verify(&plan, &tape).unwrap_or_else(|e| panic!("{name}: {e}"));
            step += plan.step.is_some() as usize;
            alike += plan.copies.is_some() as usize;
            locals += (plan.grads.local.count() > 0) as usize;
            stored += (plan.grads.stored_count() > 0) as usize;
            summed += (0..tape.len()).any(|s| plan.grads.sums_whole(s as i64)) as usize;
            let part = |i: &Item| matches!(i, Item::SumPart { .. });
            parts += plan.functions.iter().flatten().any(part) as usize;
        }
    }
    // Every kind of answer the check holds the plan to came up.
    for (what, count) in [
        ("step plans", step),
        ("copies stored once", alike),
        ("locals", locals),
        ("stored first additions", stored),
        ("vertical sums from 0", summed),
        ("sums in parts", parts),
    ] {
        assert!(count > 0, "no {what}");
    }
}

/// Per backward function, the gradients its straight-line code touches.
fn touched_by_functions(tape: &Tape, plan: &Plan) -> Vec<Vec<Slot>> {
    (plan.functions.iter())
        .map(|function| {
            let mut touched = Vec::new();
            for item in function {
                let Item::Straight(range) = item else {
                    continue;
                };
                for s in range.clone().map(Slot) {
                    if tape.op(s).is_leaf() || !tape.takes_grad(s) {
                        continue;
                    }
                    touched.push(s);
                    touched.extend(tape.args(s).iter().filter(|&a| tape.takes_grad(a)));
                }
            }
            touched.sort_unstable();
            touched.dedup();
            touched
        })
        .collect()
}

/// A function that would start from 0 a gradient an earlier-running function stored (its
/// first store forgotten), or load one nothing stored (a first store claimed too early), or
/// a last function that zeroes a gradient backward stored, or writes the loss's 1 over its
/// stored gradient, are refused.
#[test]
fn first_stores_forgotten_or_claimed_are_refused() {
    let g = Graph::new();
    classifier(&g, 8, &[6]);
    // Straight-line code only, in many functions.
    let (tape, plan) = planned(&g, false, 30);
    let touched = touched_by_functions(&tape, &plan);
    assert!(touched.len() >= 4, "{} functions", touched.len());
    let by = |s: Slot| -> Vec<usize> {
        (0..touched.len())
            .filter(|&f| touched[f].binary_search(&s).is_ok())
            .collect()
    };
    let grads = &plan.grads;
    let loss = tape.loss().unwrap();
    let plain = |s: &Slot| {
        !grads.in_loops.get(s.index()) && s.index() >= tape.num_params() && Some(*s) != tape.loss()
    };
    // A gradient two functions touch: the later one (in backward, the first) stores it.
    let shared = (tape.slots())
        .filter(plain)
        .find(|&s| by(s).len() >= 2)
        .expect("a gradient two functions touch");
    let functions = by(shared);
    let (first, then) = (*functions.last().unwrap(), functions[functions.len() - 2]);
    assert_eq!(grads.first_store(shared.index()), Some(first));
    let error = refused(&tape, &plan, |p| {
        p.grads.tamper_first_store(shared.index(), None)
    });
    assert_refused(
        &error,
        shared.index(),
        &format!("function {then} starts a gradient that memory holds from Zero"),
    );
    // Claimed by a function that runs before the one that truly stores it first.
    let error = refused(&tape, &plan, |p| {
        p.grads.tamper_first_store(shared.index(), Some(first + 1))
    });
    assert_refused(
        &error,
        shared.index(),
        &format!("function {first} starts a gradient that nothing has written yet from Memory"),
    );
    // A gradient one function touches, forgotten: `_rest` would zero it.
    let alone = (tape.slots())
        .filter(plain)
        .find(|&s| by(s).len() == 1)
        .expect("a gradient one function touches");
    let error = refused(&tape, &plan, |p| {
        p.grads.tamper_first_store(alone.index(), None)
    });
    assert_refused(
        &error,
        alone.index(),
        "_rest zeroes a gradient backward stored",
    );
    // The loss's gradient, forgotten: `_rest` would write 1 over it.
    assert!(grads.first_store(loss.index()).is_some());
    let error = refused(&tape, &plan, |p| {
        p.grads.tamper_first_store(loss.index(), None)
    });
    assert_refused(
        &error,
        loss.index(),
        "_rest writes 1 over the loss's gradient",
    );
}

/// The loop items of `items`, nests' bodies too, each map with its operands' additions.
fn maps(items: &[Item]) -> Vec<&MapLoop> {
    fn visit<'a>(item: &'a Item, out: &mut Vec<&'a MapLoop>) {
        match item {
            Item::Map(m) => out.push(m),
            Item::Dot(d) => out.push(&d.products),
            Item::Nest(n) => n.body.iter().for_each(|b| visit(b, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    items.iter().for_each(|i| visit(i, &mut out));
    out
}

/// A loop operand said to store its first addition where another operand's addition comes
/// first (a rollout's state, read by three nodes of the next step) is refused; so is a
/// gradient a loop adds into first left out of the loops' (no longer zeroed by `_init`), and
/// in a batch's copy 1, which stands for copies `2..`, one a loop stores first left out of
/// them (`_rest` would zero it).
#[test]
fn stores_not_first_and_zeroing_forgotten_are_refused() {
    let g = Graph::new();
    rollout(&g, 8, 40);
    let (tape, plan) = planned(&g, true, 250);
    let items: Vec<Item> = plan.functions.iter().flatten().cloned().collect();
    // An operand that adds into slots another operand stores first.
    let grads = &plan.grads;
    let later = maps(&items)
        .into_iter()
        .flat_map(|m| {
            (0..m.args.len())
                .filter(|&j| m.grad_args[j])
                .map(move |j| Addition::map_arg(m, j))
        })
        .find(|&a| !grads.stores_whole(a) && grads.stored_slot(a.operand().base))
        .expect("an operand adding after a stored first addition");
    let error = refused(&tape, &plan, |p| {
        p.grads.tamper_stored().insert(later);
    });
    assert!(
        error.contains("a loop stores its first addition into a gradient that memory holds"),
        "{error}"
    );
    // A gradient a loop adds into first, no longer zeroed.
    let g = Graph::new();
    recurrent_cells(&g, 16);
    let (tape, plan) = planned(&g, true, 250);
    // (Not one straight-line code reaches first: zeroing it was not needed.)
    let straight: Vec<Slot> = touched_by_functions(&tape, &plan).concat();
    let zeroed = |s: &Slot| plan.grads.zeroed(&tape, *s, false) && !straight.contains(s);
    let s = tape
        .slots()
        .filter(zeroed)
        .last()
        .expect("a gradient zeroed");
    let error = refused(&tape, &plan, |p| p.grads.in_loops.set(s.index(), false));
    assert_refused(&error, s.index(), "a gradient that nothing has written yet");
    // In a batch's copy 1, a gradient a loop stores first said to be in no loop: `_rest`
    // would zero it, in copy 1 and every copy after.
    let g = Graph::new();
    minibatch_as_copies(&g, 6, 12, 5);
    let (tape, plan) = planned(&g, true, 250);
    let copy = plan.copies.expect("copies run alike").copy(1);
    let s = (copy.clone().map(Slot))
        .find(|&s| plan.grads.stored_slot(s.0 as i64))
        .expect("a gradient stored by its first addition");
    let error = refused(&tape, &plan, |p| p.grads.in_loops.set(s.index(), false));
    assert_refused(&error, s.index(), "_rest zeroes a gradient backward stored");
}

/// Sums from 0 in vertical blocks are refused where they would drop an addition: kept where
/// the second layer's lanes run in two groups (the second group's block would drop the
/// first one's sums), and marked on a layer's inputs that the loss reads too.
#[test]
fn vertical_sums_from_zero_over_earlier_additions_are_refused() {
    let g = Graph::new();
    copies_of_two_layers(&g);
    let (tape, plan) = planned(&g, true, 250);
    let summed: Vec<usize> = (0..tape.len())
        .filter(|&s| plan.grads.sums_whole(s as i64))
        .collect();
    assert!(!summed.is_empty());
    // The vertical nest, in two groups of lanes.
    let halved = |p: &mut Plan| {
        let mut halved = false;
        for item in p.functions.iter().flatten() {
            halve_vertical_groups(item, &mut p.nests, &mut halved);
        }
        assert!(halved, "no vertical nest");
    };
    let error = refused(&tape, &plan, halved);
    assert!(
        error.contains("sums a vertical block from 0 into a gradient that memory holds"),
        "{error}"
    );
    // A layer's inputs, which the loss reads too, marked as summed from 0 by the layer's
    // vertical blocks (which would drop the loss's addition): the loss's straight-line code,
    // which comes first, would load the one it reads from memory nothing wrote.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(3);
    let l1 = Layer::new(&g, 2, 16, Activation::Relu, &mut rng);
    let l2 = Layer::new(&g, 16, 16, Activation::Relu, &mut rng);
    let h = l1.call(&g.inputs(2)).unwrap();
    let out = l2.call(&h).unwrap();
    g.set_loss(g.sum(&out) + h[0] * h[0]).unwrap();
    let (tape, plan) = planned(&g, true, 250);
    let inputs = vertical_operands(&plan);
    assert!(inputs.len() >= 16, "{inputs:?}");
    assert!(inputs.iter().all(|&s| !plan.grads.sums_whole(s as i64)));
    let error = refused(&tape, &plan, |p| {
        for &s in &inputs {
            p.grads.tamper_summed(s);
        }
    });
    let h0 = inputs
        .iter()
        .find(|&&s| error.contains(&format!("at slot {s}:")));
    assert!(h0.is_some(), "{error}");
    assert!(
        error.contains("starts a gradient that nothing has written yet from Memory"),
        "{error}"
    );
}

/// The slots of the operands every lane shares of the vertical nests of `plan` (top-level,
/// in whole blocks of steps).
fn vertical_operands(plan: &Plan) -> Vec<usize> {
    let mut out = Vec::new();
    for item in plan.functions.iter().flatten() {
        let Item::Nest(n) = item else { continue };
        if !plan.nest(n).lanes.vertical() {
            continue;
        }
        for b in &n.body {
            if let Some((map, k)) = crate::passes::lane_order::vertical_map(b, 0) {
                let whole = map.len - map.len % crate::passes::lane_order::VERTICAL_BLOCK;
                out.extend((0..whole).map(|t| map.args[k].at(t).index()));
            }
        }
    }
    out
}

/// Halves the lane group of every vertical nest of `item` whose repetitions all run in one
/// group.
fn halve_vertical_groups(item: &Item, nests: &mut super::Nests, halved: &mut bool) {
    let Item::Nest(n) = item else { return };
    let plan = nests.of_mut(n);
    if let Lanes::Both {
        group,
        vertical: true,
    } = plan.lanes
    {
        if group == n.count && group >= 2 {
            plan.lanes = Lanes::Both {
                group: group / 2,
                vertical: true,
            };
            *halved = true;
        }
    }
    for b in &n.body {
        halve_vertical_groups(b, nests, halved);
    }
}

/// In `step`, a param whose update is no longer fused leaves its loop adding into a gradient
/// nothing zeroed (the plan left it out of the loops' gradients), and a param said to be
/// fused that no loop updates would never be updated: both refused in `step`'s backward.
#[test]
fn fused_updates_lost_or_claimed_are_refused() {
    // A layer on inputs without gradient, and a param the loss reads twice.
    let g = Graph::new();
    let layer = Layer::new(&g, 20, 12, Activation::Relu, &mut StdRng::seed_from_u64(4));
    let out = layer.call(&g.inputs_without_grad(20)).unwrap();
    let scale = g.param(0.5);
    g.set_loss(g.sum(out.iter().map(|&o| o * o)) * scale + scale)
        .unwrap();
    let (tape, plan) = planned(&g, true, 250);
    let step = plan.step.as_ref().expect("step fuses the layer's updates");
    let fused: Vec<usize> = (0..tape.num_params()).filter(|&s| step.fuses(s)).collect();
    let unfused = (0..tape.num_params())
        .find(|&s| !step.fuses(s))
        .expect("a param not fused");
    let s = fused[fused.len() / 2];
    // One lane's param no longer fused: its loop still fuses the update of the vector.
    let error = refused(&tape, &plan, |p| p.step.as_mut().unwrap().fused[s] = false);
    assert_refused(
        &error,
        s,
        "step's backward: a loop makes a fused update's whole gradient of a gradient",
    );
    // None fused: the loops add into gradients nothing zeroed.
    let error = refused(&tape, &plan, |p| {
        p.step
            .as_mut()
            .unwrap()
            .fused
            .iter_mut()
            .for_each(|f| *f = false)
    });
    assert!(
        error.contains(
            "step's backward: a loop adds in memory into a gradient that nothing has written yet"
        ),
        "{error}"
    );
    let error = refused(&tape, &plan, |p| {
        p.step.as_mut().unwrap().fused[unfused] = true
    });
    assert_refused(
        &error,
        unfused,
        "step's backward: step never applies a fused param's update",
    );
}

/// How long the check takes beside the whole plan and beside `GradMemory::new`, on a
/// minibatch of 128 MNIST-shaped copies (784-50-3), a random graph of 60,000 nodes, 64
/// copies of a rollout and a chain of 64 masses over 400 steps (`cargo test --release --lib
/// time_the_grad_placement_check -- --ignored --nocapture`; `TIME_ONLY=chain` for one).
#[test]
#[ignore]
fn time_the_grad_placement_check() {
    type Build<'a> = &'a dyn Fn(&Graph);
    let builders: [(&str, Build); 4] = [
        ("mnist B=128 copies", &|g| {
            minibatch_as_copies(g, 128, 784, 50)
        }),
        ("random 60k", &|g| random_graph(g, 60_000, 2)),
        ("rollouts B=64", &|g| copies_of_a_rollout(g, 64)),
        ("chain 64x400", &|g| chain(g, 64, 400)),
    ];
    let only = std::env::var("TIME_ONLY").unwrap_or_default();
    for (name, build) in builders
        .into_iter()
        .filter(|(name, _)| name.contains(&only))
    {
        let g = Graph::new();
        build(&g);
        let tape = Tape::from_graph(&g).unwrap();
        let s = schedule(&tape, true);
        let (tape, s) = layout::apply(tape, s).unwrap();
        let options = PlanOptions {
            chunk_size: 4000,
            fast_math: false,
            zero_skipping: ZeroSkipping::Auto,
            host_avx512: false,
        };
        // The fastest of 9 runs each (a shared machine).
        let (mut plan_secs, mut check_secs, mut memory_secs) = (f64::MAX, f64::MAX, f64::MAX);
        let mut plan = None;
        for _ in 0..9 {
            let start = std::time::Instant::now();
            plan = Some(Plan::new(&tape, &s, options).unwrap());
            plan_secs = plan_secs.min(start.elapsed().as_secs_f64());
            let p = plan.as_ref().unwrap();
            let start = std::time::Instant::now();
            super::verify_grads::verify(p, &tape).unwrap();
            check_secs = check_secs.min(start.elapsed().as_secs_f64());
            let start = std::time::Instant::now();
            let local = p.grads.local.clone();
            let grads = super::GradMemory::new(
                &tape,
                &p.functions,
                &p.nests,
                p.step.as_ref(),
                local,
                p.copies.as_ref(),
            );
            memory_secs = memory_secs.min(start.elapsed().as_secs_f64());
            assert_eq!(grads, p.grads);
        }
        let plan = plan.unwrap();
        println!(
            "{name}: {} slots, {} functions, copies alike {}, step {}: Plan::new {:.2} ms \
             (GradMemory::new {:.2} ms), of which the check {:.2} ms ({:.1}%)",
            tape.len(),
            plan.functions.len(),
            plan.copies.is_some(),
            plan.step.is_some(),
            plan_secs * 1e3,
            memory_secs * 1e3,
            check_secs * 1e3,
            100.0 * check_secs / plan_secs
        );
    }
}
