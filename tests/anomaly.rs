//! Anomaly mode: the first node that made a non-finite number, named by its graph node, op
//! and operands, on every backend, before any update; off by default.

use tapejit::anomaly::Pass;
use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program};

fn backends(g: &Graph) -> Vec<Box<dyn Program>> {
    let mut programs: Vec<Box<dyn Program>> = vec![Box::new(Interpreter::new(g).unwrap())];
    for level in [OptLevel::O0, OptLevel::O2] {
        programs.push(Box::new(
            Jit::builder().opt_level(level).compile(g).unwrap(),
        ));
    }
    programs
}

#[test]
fn forward_anomalies_name_the_node_its_op_and_operands() {
    let g = Graph::new();
    let x = g.input();
    let w = g.param(0.5);
    let shifted = x - 2.0;
    let log = shifted.log();
    g.set_loss((log * w).powf(2.0) + w * w).unwrap();
    for mut p in backends(&g) {
        // Off by default: a NaN loss, no error.
        assert!(p.step(&[1.0], 0.1).unwrap().is_nan());
        p.set_params(&[0.5]).unwrap();
        p.detect_anomaly(true);
        let e = p.step(&[1.0], 0.1).unwrap_err();
        assert!(
            matches!(&e, Error::Anomaly { pass: Pass::Forward, node: Some(n), op: "log", param: None, operands, value }
                if *n == log.id() && operands == &[-1.0] && value.is_nan()),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("(log) gave NaN from operands [-1.0]"),
            "{e}"
        );
        assert_eq!(p.params(), [0.5], "no update after an anomaly");
        // Finite numbers pass.
        p.step(&[3.0], 0.1).unwrap();
        let trained = p.params();
        let e = p.train(&[3.0, 4.0, 1.5, 5.0], 0.1).unwrap_err();
        assert!(matches!(e, Error::Anomaly { op: "log", .. }), "{e}");
        // A failed train changes nothing: the steps before sample 2 are undone too.
        assert_eq!(p.params(), trained, "params after a failed train");
    }
}

#[test]
fn backward_anomalies_name_the_consumer_that_made_the_gradient() {
    let g = Graph::new();
    let x = g.input();
    let w = g.param(1.0);
    let root = (w * x).sqrt();
    g.set_loss(root + w * w).unwrap();
    for mut p in backends(&g) {
        p.detect_anomaly(true);
        p.set_inputs(&[0.0]).unwrap();
        p.forward();
        let e = p.backward().unwrap_err();
        assert!(
            matches!(&e, Error::Anomaly { pass: Pass::Backward, node: Some(n), op: "sqrt", operands, .. }
                if *n == root.id() && operands == &[0.0]),
            "{e}"
        );
    }
}

#[test]
fn a_param_an_update_made_non_finite_is_named_by_its_position() {
    let g = Graph::new();
    let x = g.input();
    let (a, b) = (g.param(1.0), g.param(1e300));
    g.set_loss(a * x + b * b * x).unwrap();
    for mut p in backends(&g) {
        p.detect_anomaly(true);
        // b * b overflows in forward: named.
        let e = p.step(&[1.0], 0.1).unwrap_err();
        assert!(matches!(e, Error::Anomaly { op: "mul", .. }), "{e}");
        p.detect_anomaly(false);
        p.set_params(&[1.0, 1e200]).unwrap();
        // The gradient 2e200 times a rate of 1e200 makes b infinite.
        p.step(&[1.0], 1e200).unwrap();
        p.detect_anomaly(true);
        let e = p.step(&[1.0], 0.1).unwrap_err();
        assert!(matches!(e, Error::Anomaly { param: Some(1), .. }), "{e}");
        assert!(e.to_string().contains("param 1"), "{e}");
    }
}
