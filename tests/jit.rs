//! The JIT as an owned object: lifetimes, introspection, options.

mod common;

use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program, Tiering};

fn small_graph(g: &Graph) {
    let x = g.input();
    let w = g.param(0.75);
    let b = g.param(-0.25);
    let y = (w * x + b).tanh();
    g.add_output(y).unwrap();
    g.set_loss((y - 0.5).powf(2.0)).unwrap();
}

fn compiled(level: OptLevel) -> Jit {
    let g = Graph::new();
    small_graph(&g);
    Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(level)
        .compile(&g)
        .unwrap()
    // The graph is dropped here: the Jit owns everything it runs.
}

#[test]
fn a_jit_outlives_its_graph_and_runs_after_others_are_dropped() {
    let mut keep = compiled(OptLevel::O2);
    for level in OptLevel::ALL {
        // Engines created and destroyed around `keep` do not disturb it.
        let mut other = compiled(level);
        other.step(&[1.0], 0.1).unwrap();
        drop(other);
    }
    let loss = keep.step(&[1.0], 0.1).unwrap();
    assert!(loss.is_finite());
}

#[test]
fn a_jit_can_move_to_another_thread() {
    fn send<T: Send>() {}
    send::<Jit>();
    let mut jit = compiled(OptLevel::O1);
    let loss = std::thread::spawn(move || jit.step(&[0.5], 0.1).unwrap())
        .join()
        .unwrap();
    assert!(loss.is_finite());
}

#[test]
fn stats_and_ir_describe_the_compilation() {
    let jit = compiled(OptLevel::O0);
    let s = jit.stats();
    assert_eq!(s.tape_nodes, jit.tape().len());
    assert!(s.ir_instructions > 0 && s.functions >= 3);
    assert!(s.ir_build_secs >= 0.0 && s.optimize_secs >= 0.0 && s.codegen_secs > 0.0);
    assert!(s.code_bytes > 0);
    // The IR is freed with the compiler unless asked for.
    assert_eq!(jit.ir(), Err(Error::IrNotKept));
    let g = Graph::new();
    small_graph(&g);
    let jit = Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(OptLevel::O0)
        .keep_ir(true)
        .compile(&g)
        .unwrap();
    let ir = jit.ir().unwrap();
    for needle in [
        "define void @forward",
        "define void @backward",
        "define void @update",
    ] {
        assert!(ir.contains(needle), "IR lacks {needle}");
    }
    // Values are named after slots, and the host CPU is stamped on every function.
    assert!(ir.contains("%n") && ir.contains("%g"));
    assert!(ir.contains("\"target-cpu\"") && ir.contains("\"target-features\""));
    // Strict numerics: no fast-math flags anywhere.
    for flag in [" fast ", " contract ", " reassoc ", " nnan ", " afn "] {
        assert!(!ir.contains(flag), "IR carries {flag}");
    }
}

#[test]
fn chunk_size_and_pipeline_options_keep_results_identical() {
    let g = Graph::new();
    small_graph(&g);
    let mut interp = Interpreter::new(&g).unwrap();
    let want = interp.step(&[0.3], 0.1).unwrap();
    let builders = [
        Jit::builder().tiering(Tiering::Off).chunk_size(1),
        Jit::builder().tiering(Tiering::Off).chunk_size(1_000_000),
        Jit::builder()
            .tiering(Tiering::Off)
            .pipeline("function(instcombine,gvn)"),
        Jit::builder()
            .tiering(Tiering::Off)
            .opt_level(OptLevel::O3)
            .codegen(OptLevel::O0),
    ];
    for b in builders {
        let mut jit = b.compile(&g).unwrap();
        assert_eq!(jit.step(&[0.3], 0.1).unwrap().to_bits(), want.to_bits());
        assert_eq!(jit.params(), interp.params());
    }
}

#[test]
fn a_bad_pipeline_is_an_llvm_error() {
    let g = Graph::new();
    small_graph(&g);
    let err = Jit::builder()
        .tiering(Tiering::Off)
        .pipeline("no-such-pass")
        .compile(&g)
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            tapejit::Error::Llvm {
                stage: "optimization",
                ..
            }
        ),
        "{err}"
    );
}

/// A program split into modules compiles to the same IR on any number of threads, and each
/// runs bit for bit like the interpreter (entry points in module 0 calling functions the
/// other modules define, `step` and `train` included).
#[test]
fn modules_compile_alike_on_any_number_of_threads() {
    use rand::{rngs::StdRng, SeedableRng};
    use tapejit::nn::Classifier;
    let g = Graph::new();
    Classifier::new(&g, 12, &[10, 7], 3, &mut StdRng::seed_from_u64(3)).unwrap();
    for recovery in [true, false] {
        let build = |threads| {
            Jit::builder()
                .tiering(Tiering::Off)
                .opt_level(OptLevel::O1)
                .loop_recovery(recovery)
                .chunk_size(12)
                .compile_threads(threads)
                .keep_ir(true)
                .compile(&g)
                .unwrap()
        };
        let one = build(1);
        assert!(one.stats().modules >= 4, "{:?}", one.stats());
        assert_eq!(one.stats().compile_threads, 1);
        let mut backends = vec![common::interpreter(&g)];
        for threads in [1, 2, 5] {
            let jit = build(threads);
            assert_eq!(jit.ir().unwrap(), one.ir().unwrap(), "{threads} threads");
            assert_eq!(
                jit.stats().compile_threads,
                threads.min(jit.stats().modules)
            );
            backends.push(common::Backend {
                name: format!("jit on {threads} threads, recovery {recovery}"),
                program: Box::new(jit),
            });
        }
        common::assert_backends_agree(
            &format!("recovery {recovery}"),
            &mut backends,
            &mut StdRng::seed_from_u64(11),
        );
    }
}
