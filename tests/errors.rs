//! Every `Error` the public API can produce, on every path that produces it, with a Display
//! message that locates the problem. Misuse must be a typed error, never a panic or a wrong
//! answer.

mod common;

use common::{interpreter_and_every_jit_level, semantics_backends};
use rand::rngs::StdRng;
use rand::SeedableRng;
use strum::IntoEnumIterator;
use tapejit::checkpoint::Checkpoint;
use tapejit::nn::Classifier;
use tapejit::op::F64;
use tapejit::{Error, Graph, Interpreter, Jit, Op, OptLevel, Program, Slot, Tape, Value};

/// Asserts that `error` is `expected` and that its message mentions every fragment.
fn assert_error(context: &str, error: Error, expected: &Error, fragments: &[&str]) {
    assert_eq!(&error, expected, "{context}");
    let message = error.to_string();
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "{context}: message {message:?} does not mention {fragment:?}"
        );
    }
}

/// Every way of turning a graph into something runnable, so each error is checked on all.
fn compile_everywhere(graph: &Graph) -> Vec<(String, Result<(), Error>)> {
    let mut results = vec![
        (
            "Tape::from_graph".to_string(),
            Tape::from_graph(graph).map(drop),
        ),
        (
            "Interpreter::new".to_string(),
            Interpreter::new(graph).map(drop),
        ),
        ("Jit::compile".to_string(), Jit::compile(graph).map(drop)),
    ];
    for level in OptLevel::ALL {
        let result = Jit::builder().opt_level(level).compile(graph).map(drop);
        results.push((format!("Jit at {level:?}"), result));
    }
    results
}

// ---------------------------------------------------------------------------------------------
// ForeignValue
// ---------------------------------------------------------------------------------------------

/// Operators cannot return errors, so mixing graphs poisons the graph and compiling it fails.
#[test]
fn combining_values_of_two_graphs_fails_to_compile() {
    let (ours, theirs) = (Graph::new(), Graph::new());
    let x = ours.input();
    let _padding = theirs.input();
    let foreign = theirs.param(1.0);
    let mixed = x + foreign;
    ours.set_loss(mixed).unwrap();
    let expected = Error::ForeignValue {
        node: foreign.id(),
        value_graph: theirs.id(),
        graph: ours.id(),
        context: "add",
    };
    let fragments = [
        "#1",
        &theirs.id().to_string(),
        &ours.id().to_string(),
        "add",
    ];
    for (path, result) in compile_everywhere(&ours) {
        assert_error(&path, result.unwrap_err(), &expected, &fragments);
    }
    // The other graph is not affected.
    theirs.set_loss(foreign * 2.0).unwrap();
    assert!(Interpreter::new(&theirs).is_ok());
}

/// The first misuse is the one reported, whichever operator or method made it.
#[test]
fn every_operator_reports_mixing_graphs() {
    type Mix = for<'g> fn(Value<'g>, Value<'g>) -> Value<'g>;
    let cases: [(&str, Mix); 5] = [
        ("sub", |a, b| a - b),
        ("mul", |a, b| a * b),
        ("div", |a, b| a / b),
        ("sum", |a, b| a.graph().sum(&[a, b])),
        ("add", |mut a, b| {
            a += b;
            a * b // a second misuse, not reported
        }),
    ];
    for (op, mix) in cases {
        let (ours, theirs) = (Graph::new(), Graph::new());
        let (a, b) = (ours.input(), theirs.input());
        mix(a, b);
        let error = Tape::from_graph(&ours).unwrap_err();
        let expected = Error::ForeignValue {
            node: b.id(),
            value_graph: theirs.id(),
            graph: ours.id(),
            context: op,
        };
        assert_error(op, error, &expected, &[op]);
    }
}

#[test]
fn set_loss_and_add_output_reject_a_foreign_value() {
    let (ours, theirs) = (Graph::new(), Graph::new());
    ours.input();
    let foreign = theirs.input();
    let expected = |context| Error::ForeignValue {
        node: foreign.id(),
        value_graph: theirs.id(),
        graph: ours.id(),
        context,
    };
    let error = ours.set_loss(foreign).unwrap_err();
    assert_error("set_loss", error, &expected("set_loss"), &["set_loss"]);
    let error = ours.add_output(foreign).unwrap_err();
    assert_error(
        "add_output",
        error,
        &expected("add_output"),
        &["add_output"],
    );
    // A rejected call changes nothing: the graph still compiles, without loss or outputs.
    let tape = Tape::from_graph(&ours).unwrap();
    assert_eq!((tape.loss(), tape.outputs().len()), (None, 0));
}

#[test]
fn looking_up_a_foreign_value_fails() {
    let (ours, theirs) = (Graph::new(), Graph::new());
    let p = ours.param(1.0);
    ours.set_loss(p * p).unwrap();
    let foreign = theirs.param(1.0);
    let expected = Error::ForeignValue {
        node: foreign.id(),
        value_graph: theirs.id(),
        graph: ours.id(),
        context: "tape lookup",
    };
    for (backend, compile) in semantics_backends() {
        let mut program = compile(&ours);
        program.forward();
        program.backward().unwrap();
        // Same node id as a value of ours: only the graph tells them apart.
        assert_eq!(foreign.id(), p.id());
        let error = program.value(foreign).unwrap_err();
        assert_error(
            &format!("{backend}: value"),
            error,
            &expected,
            &["tape lookup"],
        );
        let error = program.grad(foreign).unwrap_err();
        assert_error(
            &format!("{backend}: grad"),
            error,
            &expected,
            &["tape lookup"],
        );
    }
}

// ---------------------------------------------------------------------------------------------
// NoLoss
// ---------------------------------------------------------------------------------------------

/// A graph without a loss compiles (forward-only programs are useful), but cannot be
/// differentiated.
#[test]
fn backward_step_and_loss_without_a_loss_fail() {
    let g = Graph::new();
    let x = g.input();
    let p = g.param(2.0);
    g.add_output(p * x).unwrap();
    for (backend, compile) in semantics_backends() {
        let mut program = compile(&g);
        program.set_inputs(&[3.0]).unwrap();
        assert!(
            program.forward().is_nan(),
            "{backend}: forward returns NaN for no loss"
        );
        assert_eq!(
            program.outputs(),
            [6.0],
            "{backend}: forward still computes outputs"
        );
        let fragments = ["no loss", "set_loss"];
        let error = program.backward().unwrap_err();
        assert_error(
            &format!("{backend}: backward"),
            error,
            &Error::NoLoss,
            &fragments,
        );
        let error = program.loss().unwrap_err();
        assert_error(
            &format!("{backend}: loss"),
            error,
            &Error::NoLoss,
            &fragments,
        );
        let error = program.step(&[3.0], 0.1).unwrap_err();
        assert_error(
            &format!("{backend}: step"),
            error,
            &Error::NoLoss,
            &fragments,
        );
        // The failed step changed nothing.
        assert_eq!(program.params(), &[2.0], "{backend}");
    }
}

// ---------------------------------------------------------------------------------------------
// WrongLength and NonFinite
// ---------------------------------------------------------------------------------------------

fn two_inputs_three_params(g: &Graph) {
    let x = g.inputs(2);
    let p = [g.param(1.0), g.param(2.0), g.param(3.0)];
    g.set_loss(g.sum(&[x[0] * p[0], x[1] * p[1], p[2]]))
        .unwrap();
}

#[test]
fn wrong_number_of_inputs_or_params_fails_and_changes_nothing() {
    let g = Graph::new();
    two_inputs_three_params(&g);
    for (backend, compile) in semantics_backends() {
        let mut program = compile(&g);
        program.set_inputs(&[1.0, 1.0]).unwrap();
        let before = program.values().to_vec();
        for wrong in [vec![], vec![5.0], vec![5.0, 5.0, 5.0]] {
            let expected = Error::WrongLength {
                what: "inputs",
                expected: 2,
                got: wrong.len(),
            };
            let error = program.set_inputs(&wrong).unwrap_err();
            let fragments = ["inputs", "expected 2", &format!("got {}", wrong.len())];
            assert_error(
                &format!("{backend}: set_inputs"),
                error,
                &expected,
                &fragments,
            );
        }
        for wrong in [vec![], vec![5.0, 5.0], vec![5.0; 4]] {
            let expected = Error::WrongLength {
                what: "params",
                expected: 3,
                got: wrong.len(),
            };
            let error = program.set_params(&wrong).unwrap_err();
            let fragments = ["params", "expected 3", &format!("got {}", wrong.len())];
            assert_error(
                &format!("{backend}: set_params"),
                error,
                &expected,
                &fragments,
            );
        }
        let error = program.step(&[1.0], 0.1).unwrap_err();
        assert!(
            matches!(error, Error::WrongLength { what: "inputs", .. }),
            "{backend}: step"
        );
        assert_eq!(
            program.values(),
            before.as_slice(),
            "{backend}: nothing changed"
        );
    }
}

#[test]
fn non_finite_inputs_and_params_are_rejected_and_change_nothing() {
    let g = Graph::new();
    two_inputs_three_params(&g);
    for (backend, compile) in semantics_backends() {
        let mut program = compile(&g);
        program.set_inputs(&[1.0, 1.0]).unwrap();
        let before = program.values().to_vec();
        let cases = [
            ([f64::NAN, 0.0], 0, "NaN"),
            ([0.0, f64::INFINITY], 1, "inf"),
            ([f64::NEG_INFINITY, f64::NAN], 0, "-inf"),
        ];
        for (inputs, index, shown) in cases {
            let context = format!("{backend}: set_inputs({inputs:?})");
            let error = program.set_inputs(&inputs).unwrap_err();
            match error {
                Error::NonFinite {
                    what: "input",
                    index: i,
                    value,
                } => {
                    assert_eq!(i, index, "{context}");
                    assert_eq!(value.to_bits(), inputs[index].to_bits(), "{context}");
                }
                other => panic!("{context}: expected NonFinite, got {other:?}"),
            }
            let message = error.to_string();
            let fragments = [format!("input {index}"), shown.to_string(), "finite".into()];
            for fragment in &fragments {
                assert!(
                    message.contains(fragment.as_str()),
                    "{context}: {message:?} lacks {fragment:?}"
                );
            }
            let error = program.step(&inputs, 0.1).unwrap_err();
            assert!(
                matches!(error, Error::NonFinite { what: "input", .. }),
                "{context}: step"
            );
        }
        let params = program.params().to_vec();
        let mut bad = params.clone();
        bad[2] = f64::INFINITY;
        let error = program.set_params(&bad).unwrap_err();
        assert!(
            matches!(
                error,
                Error::NonFinite {
                    what: "param",
                    index: 2,
                    ..
                }
            ),
            "{backend}: set_params with inf gave {error:?}"
        );
        assert!(error.to_string().contains("param 2"), "{error}");
        assert_eq!(
            program.params(),
            params.as_slice(),
            "{backend}: params kept"
        );
        assert_eq!(
            program.values(),
            before.as_slice(),
            "{backend}: nothing changed"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// NonFiniteLearningRate
// ---------------------------------------------------------------------------------------------

/// Everything a call could change, as bits: every kept slot's value and gradient, params and
/// their gradients in creation order.
fn state_bits(p: &dyn Program) -> Vec<u64> {
    let kept = (0..p.tape().len()).filter(|&s| p.is_kept(Slot(s as u32)));
    let slots: Vec<f64> = kept.flat_map(|s| [p.values()[s], p.grads()[s]]).collect();
    [slots, p.params(), p.param_grads()]
        .concat()
        .into_iter()
        .map(f64::to_bits)
        .collect()
}

/// A NaN or infinite learning rate would make every param NaN (`set_params` refuses NaN,
/// so `update` must too): `update`, `step` and `train` refuse it and change nothing, on the
/// interpreter and on the JIT, whose `train` is native code here (a classifier).
#[test]
fn a_non_finite_learning_rate_is_refused_and_changes_nothing() {
    let g = Graph::new();
    Classifier::new(&g, 6, &[5], 3, &mut StdRng::seed_from_u64(7)).unwrap();
    let sample = [0.5, -0.25, 1.0, 0.0, 2.0, -1.5, 0.0, 1.0, 0.0];
    for (backend, compile) in semantics_backends() {
        let mut program = compile(&g);
        // Nonzero gradients, so that a NaN update would show.
        program.step(&sample, 0.1).unwrap();
        program.forward();
        program.backward().unwrap();
        for lr in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let before = state_bits(program.as_ref());
            let calls: [(&str, Result<(), Error>); 3] = [
                ("update", program.update(lr)),
                ("step", program.step(&sample, lr).map(drop)),
                ("train", program.train(&sample.repeat(2), lr).map(drop)),
            ];
            for (method, result) in calls {
                let context = format!("{backend}: {method} with lr {lr}");
                match result {
                    Err(Error::NonFiniteLearningRate { value }) => {
                        assert_eq!(value.to_bits(), lr.to_bits(), "{context}")
                    }
                    other => panic!("{context}: expected NonFiniteLearningRate, got {other:?}"),
                }
            }
            assert_eq!(
                state_bits(program.as_ref()),
                before,
                "{backend}: lr {lr} changed something"
            );
        }
        let message = program.update(f64::NAN).unwrap_err().to_string();
        assert!(
            message.contains("learning rate") && message.contains("NaN"),
            "{message}"
        );
        // Any finite rate is accepted, negative (ascent) and 0 included.
        for lr in [0.0, -0.1, f64::MAX, f64::MIN_POSITIVE] {
            assert_eq!(program.update(lr), Ok(()), "{backend}: lr {lr}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// train's lengths
// ---------------------------------------------------------------------------------------------

/// `train` takes a whole number (at least one) of samples; any other length, and any call on
/// a graph without inputs (a sample of no numbers cannot be counted), is `WrongLength` on
/// every backend, including the JIT's native `train`, and runs nothing.
#[test]
fn train_with_a_bad_length_or_without_inputs_is_a_typed_error_on_every_backend() {
    let classifier = Graph::new();
    Classifier::new(&classifier, 5, &[4], 2, &mut StdRng::seed_from_u64(8)).unwrap();
    let width = classifier.num_inputs();
    let no_inputs = Graph::new();
    let p = no_inputs.param(0.5);
    no_inputs.set_loss((p * 3.0).tanh()).unwrap();
    let cases = [
        (&classifier, vec![0, 1, width - 1, width + 1, 3 * width - 2]),
        (&no_inputs, vec![0, 1, 4]),
    ];
    for (g, lengths) in cases {
        for mut b in interpreter_and_every_jit_level(g) {
            let program = b.program.as_mut();
            let before = state_bits(program);
            for len in &lengths {
                let inputs = vec![0.5; *len];
                let context = format!("{}: train on {len} numbers", b.name);
                match program.train(&inputs, 0.1) {
                    Err(Error::WrongLength { got, .. }) => assert_eq!(got, *len, "{context}"),
                    other => panic!("{context}: expected WrongLength, got {other:?}"),
                }
            }
            assert_eq!(state_bits(program), before, "{}: nothing ran", b.name);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checkpoint sizes
// ---------------------------------------------------------------------------------------------

/// Checkpoints are safetensors: an MLP's params as PyTorch's `layers.{l}.weight` and
/// `.bias`, any other model's as one `params` tensor, with the architecture in the metadata
/// (any size: the first format's `u32` entries are gone). Files of the first format are
/// still read.
#[test]
fn checkpoints_are_safetensors_and_the_first_format_is_still_read() {
    // An MLP 3-2-1: neuron by neuron, its weights then its bias.
    let mlp = Checkpoint {
        architecture: vec![3, 2, 1],
        params: vec![1.0, 2.0, 3.0, 0.5, 4.0, 5.0, 6.0, -0.5, 7.0, 8.0, 0.25],
        optimizer: None,
    };
    let bytes = mlp.to_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensor = |name: &str| {
        let t = file.tensor(name).unwrap();
        let xs: Vec<f64> = t
            .data()
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (t.shape().to_vec(), xs)
    };
    assert_eq!(
        tensor("layers.0.weight"),
        (vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    );
    assert_eq!(tensor("layers.0.bias"), (vec![2], vec![0.5, -0.5]));
    assert_eq!(tensor("layers.1.weight"), (vec![1, 2], vec![7.0, 8.0]));
    assert_eq!(tensor("layers.1.bias"), (vec![1], vec![0.25]));
    assert_eq!(Checkpoint::from_bytes(&bytes, "mlp").unwrap(), mlp);

    // Not an MLP's count of params: one tensor. Sizes beyond u32 round-trip.
    let other = Checkpoint {
        architecture: vec![4, (1usize << 32) + 3, 2],
        params: vec![1.0, 2.0],
        optimizer: None,
    };
    let bytes = other.to_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.names(), ["params"]);
    assert_eq!(Checkpoint::from_bytes(&bytes, "other").unwrap(), other);

    // The first format: magic, version 1, the architecture as u32s, the params, FNV-1a 64.
    let mut first = b"TJPARAMS".to_vec();
    first.extend(1u32.to_le_bytes());
    first.extend(2u32.to_le_bytes());
    first.extend([2u32, 1].iter().flat_map(|a| a.to_le_bytes()));
    first.extend(3u64.to_le_bytes());
    first.extend([0.5f64, -1.0, 2.0].iter().flat_map(|p| p.to_le_bytes()));
    let sum = first.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    first.extend(sum.to_le_bytes());
    let read = Checkpoint::from_bytes(&first, "first").unwrap();
    assert_eq!(
        (read.architecture, read.params),
        (vec![2, 1], vec![0.5, -1.0, 2.0])
    );
    let last = first.len() - 1;
    first[last] ^= 1;
    assert!(matches!(
        Checkpoint::from_bytes(&first, "first"),
        Err(Error::Checkpoint { .. })
    ));
}

/// `load_for` refuses a file of the right architecture that holds another number of params
/// (a file of 5 params claiming an MLP 2-3-1's 13), naming both counts.
#[test]
fn checkpoints_must_hold_the_models_count_of_params() {
    let dir = std::env::temp_dir().join(format!("tapejit-count-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("short.safetensors");
    let short = Checkpoint {
        architecture: vec![2, 3, 1],
        params: vec![0.5; 5],
        optimizer: None,
    };
    short.save(&path).unwrap();
    let err = Checkpoint::load_for(&path, &[2, 3, 1], 13).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint { problem, .. } if problem.contains("holds 5 params") && problem.contains("has 13")),
        "{err}"
    );
    assert_eq!(
        Checkpoint::load_for(&path, &[2, 3, 1], 5).unwrap(),
        short.params
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// NotOnTape
// ---------------------------------------------------------------------------------------------

#[test]
fn values_not_on_the_tape_cannot_be_looked_up() {
    let g = Graph::new();
    let x = g.input();
    let p = g.param(1.0);
    let dead = (x * 2.0).exp();
    g.set_loss(p * x).unwrap();
    let programs: Vec<(&str, Box<dyn Program>)> = semantics_backends()
        .into_iter()
        .map(|(name, compile)| (name, compile(&g)))
        .collect();
    let created_after_compiling = p + 1.0;
    for (backend, program) in &programs {
        for (why, v) in [
            ("dead", dead),
            ("created after compiling", created_after_compiling),
        ] {
            let context = format!("{backend}: {why}");
            let expected = Error::NotOnTape { node: v.id() };
            let fragment = format!("#{}", v.id());
            let error = program.value(v).unwrap_err();
            assert_error(
                &format!("{context} value"),
                error,
                &expected,
                &[&fragment, "not on the tape"],
            );
            let error = program.grad(v).unwrap_err();
            assert_error(&format!("{context} grad"), error, &expected, &[&fragment]);
        }
    }
}

/// `Graph::apply` builds any op but refuses leaves it cannot number and wrong operand counts.
#[test]
fn apply_refuses_inputs_params_and_wrong_operand_counts() {
    let g = Graph::new();
    let x = g.input();
    let cases = [
        (Op::Input(0), vec![], Error::LeafOp { op: "input" }),
        (Op::Param(3), vec![], Error::LeafOp { op: "param" }),
        (
            Op::Add,
            vec![x],
            Error::Arity {
                op: "add",
                expected: Some(2),
                got: 1,
            },
        ),
        (
            Op::Const(1.0),
            vec![x],
            Error::Arity {
                op: "const",
                expected: Some(0),
                got: 1,
            },
        ),
        (
            Op::Sum,
            vec![],
            Error::Arity {
                op: "sum",
                expected: None,
                got: 0,
            },
        ),
    ];
    let nodes = g.len();
    for (op, operands, expected) in cases {
        assert_eq!(g.apply(op, &operands).unwrap_err(), expected, "{op:?}");
    }
    assert_eq!(g.len(), nodes, "a refused apply adds no node");
    assert!(Error::Arity {
        op: "sum",
        expected: None,
        got: 0
    }
    .to_string()
    .contains("one or more"));
    let y = g.apply(Op::Tanh, &[x]).unwrap();
    g.set_loss(g.apply(Op::Sum, &[y, x, y]).unwrap()).unwrap();
    let mut p = Interpreter::new(&g).unwrap();
    p.set_inputs(&[0.5]).unwrap();
    assert_eq!(p.forward(), 2.0 * 0.5f64.tanh() + 0.5);
}

/// Slots past the end of a tape are typed errors (`Tape::node`) or not kept (`is_kept`),
/// and an op given too few operands reads NaN rather than panicking.
#[test]
fn out_of_range_slots_and_missing_operands_do_not_panic() {
    let g = Graph::new();
    let x = g.input();
    g.set_loss(x.tanh()).unwrap();
    let jit = Jit::compile(&g).unwrap();
    let interp = Interpreter::new(&g).unwrap();
    let tape = jit.tape();
    let past = Slot(tape.len() as u32);
    assert_eq!(
        tape.node(past).unwrap_err(),
        Error::NoSuchSlot {
            slot: past.0,
            len: tape.len()
        }
    );
    assert!(tape.node(Slot(0)).is_ok());
    assert!(!jit.is_kept(past) && !interp.is_kept(Slot(u32::MAX)));

    for op in Op::iter() {
        // NaN operands make NaN, except where IEEE says otherwise (`pow(NaN, 0) = 1`).
        let value = op.forward(&mut F64, &[]);
        assert!(
            value.is_nan() || op.is_leaf() || op == Op::Powf(0.0),
            "{op:?}"
        );
        let mut local = Vec::new();
        op.local_grads(&mut F64, &[], 1.0, 1.0, &mut local);
        let operands = if op.is_leaf() {
            0
        } else {
            op.arity().unwrap_or(1)
        };
        assert_eq!(local.len(), operands, "{op:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Variants the public API cannot produce
// ---------------------------------------------------------------------------------------------

/// `InvalidTape` reports a broken tape invariant, a bug in a pass. `Tape` has no public
/// constructor but `from_graph` (which verifies) and no way to modify a tape, so from the
/// outside it is unreachable: a tape built from any graph verifies. The message is checked
/// on a hand-made value.
#[test]
fn invalid_tape_is_unreachable_but_well_described() {
    let g = Graph::new();
    two_inputs_three_params(&g);
    let tape = Tape::from_graph(&g).unwrap();
    assert_eq!(tape.verify(), Ok(()));
    assert!(Jit::builder().compile_tape(tape).is_ok());

    let error = Error::InvalidTape {
        slot: 17,
        what: "operand slot 20 does not precede its user".into(),
    };
    let message = error.to_string();
    assert!(
        message.contains("slot 17") && message.contains("operand slot 20"),
        "{message}"
    );
}

/// `Llvm` reports LLVM failing to initialize the host, verify, optimize or JIT; no graph
/// makes valid IR fail, so it is not reachable here. The message is checked on a hand-made
/// value.
#[test]
fn llvm_failure_is_well_described() {
    let error = Error::Llvm {
        stage: "module verification",
        message: "Instruction does not dominate all uses!".into(),
    };
    let message = error.to_string();
    assert!(message.contains("LLVM"), "{message}");
    assert!(message.contains("module verification"), "{message}");
    assert!(message.contains("does not dominate"), "{message}");
}

// ---------------------------------------------------------------------------------------------
// UnknownOptLevel
// ---------------------------------------------------------------------------------------------

#[test]
fn opt_levels_parse_from_their_names_and_nothing_else() {
    for level in OptLevel::ALL {
        assert_eq!(level.to_string().parse::<OptLevel>(), Ok(level));
    }
    for bad in ["O4", "o2", "", "interp"] {
        let e = bad.parse::<OptLevel>().unwrap_err();
        assert_eq!(e, Error::UnknownOptLevel { given: bad.into() }, "{bad:?}");
        assert!(e.to_string().contains("O0, O1, O2 or O3"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Found by probing the API (session 39)
// ---------------------------------------------------------------------------------------------

#[test]
fn a_param_made_nan_or_infinite_fails_to_compile() {
    for init in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let g = Graph::new();
        let w = g.param(0.5);
        let bad = g.param(init);
        g.set_loss((w * bad).powf(2.0)).unwrap();
        for (name, result) in compile_everywhere(&g) {
            match result {
                Err(Error::NonFinite {
                    what: "param",
                    index: 1,
                    value,
                }) => {
                    assert_eq!(value.to_bits(), init.to_bits(), "{name}")
                }
                other => panic!("{name}: a param of {init} gave {other:?}"),
            }
        }
    }
}

#[test]
fn optimizer_states_and_settings_that_would_make_params_nan_are_refused() {
    use tapejit::optim::{Adam, Optimizer, State};
    let g = Graph::new();
    let x = g.input();
    let w = g.param(0.5);
    g.set_loss((w * x - 1.0).powf(2.0)).unwrap();
    for (name, mut p) in [
        (
            "interpreter",
            Box::new(Interpreter::new(&g).unwrap()) as Box<dyn Program>,
        ),
        ("jit", Box::new(Jit::compile(&g).unwrap())),
    ] {
        let eps_zero = Optimizer::from(Adam {
            eps: 0.0,
            ..Adam::default()
        });
        assert!(
            matches!(p.set_optimizer(eps_zero), Err(Error::Optimizer { .. })),
            "{name}: eps 0"
        );
        p.set_optimizer(Optimizer::from(Adam::default())).unwrap();
        let state = |steps, sq: f64| State {
            steps,
            buffers: vec![
                ("exp_avg".into(), vec![0.0]),
                ("exp_avg_sq".into(), vec![sq]),
            ],
        };
        for (what, bad) in [
            ("steps 2^64 - 1", state(u64::MAX, 0.0)),
            ("negative exp_avg_sq", state(3, -1.0)),
        ] {
            assert!(
                matches!(p.set_optimizer_state(&bad), Err(Error::Optimizer { .. })),
                "{name}: {what}"
            );
        }
        p.set_optimizer_state(&state(3, 0.25)).unwrap();
    }
}

#[test]
fn a_checkpoint_of_sgd_without_momentum_loads() {
    use tapejit::optim::{Optimizer, Sgd};
    let g = Graph::new();
    let x = g.input();
    let w = g.param(0.5);
    let b = g.param(0.25);
    g.set_loss((w * x - b).powf(2.0)).unwrap();
    let mut p = Interpreter::new(&g).unwrap();
    p.set_optimizer(Optimizer::from(Sgd {
        weight_decay: 0.1,
        ..Sgd::default()
    }))
    .unwrap();
    p.step(&[1.0], 0.1).unwrap();
    let bytes = Checkpoint::of(&p, &[1, 1]).to_bytes().unwrap();
    Checkpoint::from_bytes(&bytes, "memory").unwrap();
}

#[test]
fn samples_too_wide_to_count_are_refused() {
    let labels = [1u8, 2];
    let wide = tapejit::Samples::new().one_hot(&labels, usize::MAX / 2 + 2);
    assert!(matches!(wide, Err(Error::Samples { .. })), "{wide:?}");
    let numbers = [0.5, 0.25];
    let wider = tapejit::Samples::new()
        .numbers(&numbers, 1)
        .and_then(|s| s.one_hot(&labels, usize::MAX));
    assert!(matches!(wider, Err(Error::Samples { .. })), "{wider:?}");
}

#[test]
fn a_failed_export_leaves_no_object_file() {
    let g = Graph::new();
    let x = g.input();
    let w = g.param(0.5);
    g.set_loss((w * x).powf(2.0)).unwrap();
    let jit = Jit::compile(&g).unwrap();
    let dir = std::env::temp_dir().join(format!("tapejit-export-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("model.h")).unwrap();
    let object = dir.join("model.o");
    let options = tapejit::ExportOptions::new("model");
    assert!(matches!(
        jit.export(&object, &options),
        Err(Error::Export { .. })
    ));
    assert!(!object.exists(), "the failed export left {object:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
