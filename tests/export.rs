//! `Jit::export`: the object and header, linked into a C program by the system's C compiler,
//! compute every bit the JIT computes (forward, and training by each optimizer); two models
//! link into one binary; bad requests are typed errors. Skipped, with a message, where no C
//! compiler exists.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::{rngs::StdRng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::optim::{Adam, AdamW, Optimizer, Sgd};
use tapejit::{
    Error, ExportOptions, ExportParams, ExportTarget, Graph, Jit, OptLevel, Program, Tiering, Value,
};

/// The C compiler (`CC`, else `cc`), if it runs.
fn c_compiler() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let works = Command::new(&cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !works {
        eprintln!("skipped: no C compiler ({cc}) to link the exported object with");
    }
    works.then_some(cc)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tapejit-export-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small net touching every math function and a loss: 3 inputs, 2 outputs.
fn model(g: &Graph) {
    let x: Vec<Value> = (0..3).map(|_| g.input()).collect();
    let mut k = 0.0;
    let mut param = || {
        k += 1.0;
        g.param(((k * 0.37f64).sin()) * 0.5)
    };
    let hidden: Vec<Value> = (0..4)
        .map(|_| {
            let s = x.iter().fold(param(), |acc, &xi| acc + param() * xi);
            s.tanh()
        })
        .collect();
    let a = hidden[0].exp() + hidden[1].softplus() + (hidden[2] * hidden[2] + 1.0).log();
    let b = hidden[3].sin() * hidden[0].cos()
        + (hidden[1].abs() + 0.5).powf(1.7)
        + hidden[2].sigmoid()
        + hidden[3].log1p().max(hidden[0]);
    let (a, b) = (a * param(), b * param());
    g.add_output(a).unwrap();
    g.add_output(b).unwrap();
    let target = x[2];
    g.set_loss((a - target).powf(2.0) + (b - 0.25).powf(2.0))
        .unwrap();
}

fn samples(n: usize) -> Vec<f64> {
    (0..n * 3)
        .map(|i| ((i as f64) * 0.61).sin() * 1.5)
        .collect()
}

fn compiled(optimizer: Optimizer) -> Jit {
    let g = Graph::new();
    model(&g);
    Jit::builder()
        .tiering(Tiering::Off)
        .optimizer(optimizer)
        .compile(&g)
        .unwrap()
}

/// C array initializers of `xs`' bits.
fn bits(xs: &[f64]) -> String {
    let mut s = String::new();
    for x in xs {
        let _ = write!(s, "0x{:016x}ull, ", x.to_bits());
    }
    if xs.is_empty() {
        s.push('0');
    }
    s
}

/// Compiles `main` with the object and header in `dir`, runs it and returns the numbers it
/// printed (one `%016llx` of bits per line).
fn run_c(cc: &str, dir: &Path, objects: &[&str], main: &str) -> Vec<f64> {
    let source = dir.join("main.c");
    std::fs::write(&source, main).unwrap();
    let exe = dir.join("main");
    let out = Command::new(cc)
        .current_dir(dir)
        .arg("-O2")
        .arg("main.c")
        .args(objects)
        .arg("-lm")
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| f64::from_bits(u64::from_str_radix(l.trim(), 16).unwrap()))
        .collect()
}

const PRELUDE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
static double from_bits(uint64_t b) { double x; memcpy(&x, &b, 8); return x; }
static void print(double x) { uint64_t b; memcpy(&b, &x, 8); printf("%016llx\n", (unsigned long long)b); }
"#;

fn assert_same_bits(what: &str, got: &[f64], expected: &[f64]) {
    assert_eq!(got.len(), expected.len(), "{what}: count");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{what}[{i}]: C {g} against the JIT's {e}"
        );
    }
}

/// Forward of `jit`'s frozen params exported for `target`, run by C on `n` samples of
/// `xs`: each sample's loss and outputs, bit for bit the JIT's.
fn assert_forward_matches(cc: &str, name: &str, jit: &mut Jit, target: ExportTarget, xs: &[f64]) {
    let width = jit.tape().num_inputs();
    let n = xs.len() / width;
    let mut expected = Vec::new();
    for x in xs.chunks(width) {
        jit.set_inputs(x).unwrap();
        expected.push(jit.forward());
        expected.extend(jit.outputs());
    }
    let dir = scratch(name);
    let options = ExportOptions::new("m").target(target);
    let exported = jit.export(dir.join("m.o"), &options).unwrap();
    assert!(exported.header.ends_with("m.h"));
    let main = format!(
        r#"{PRELUDE}
#include "m.h"
static const uint64_t X[] = {{ {} }};
int main(void) {{
    double *ws = aligned_alloc(64, ((M_WORKSPACE_DOUBLES * 8 + 63) / 64) * 64);
    double x[M_NUM_INPUTS + 1], out[M_NUM_OUTPUTS + 1];
    m_init(ws);
    for (int s = 0; s < {n}; s++) {{
        for (int i = 0; i < M_NUM_INPUTS; i++) x[i] = from_bits(X[s * M_NUM_INPUTS + i]);
        print(m_forward(ws, x, out));
        for (int i = 0; i < M_NUM_OUTPUTS; i++) print(out[i]);
    }}
    return 0;
}}"#,
        bits(xs)
    );
    let got = run_c(cc, &dir, &["m.o"], &main);
    assert_same_bits(name, &got, &expected);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Forward of frozen params, for the host and the generic target.
#[test]
fn exported_forward_is_bit_identical() {
    let Some(cc) = c_compiler() else { return };
    let mut jit = compiled(Optimizer::default());
    for (name, target) in [
        ("host", ExportTarget::Host),
        ("generic", ExportTarget::Generic),
    ] {
        assert_forward_matches(&cc, name, &mut jit, target, &samples(5));
    }
}

/// Every level, fast math, and a batch written as copies of one network (the plan's nests
/// over copies) export the code they run.
#[test]
fn exports_follow_the_program_s_options_and_shapes() {
    let Some(cc) = c_compiler() else { return };
    let g = Graph::new();
    model(&g);
    for level in [OptLevel::O0, OptLevel::O1, OptLevel::O3] {
        let builder = Jit::builder().opt_level(level).tiering(Tiering::Off);
        let mut jit = builder.compile(&g).unwrap();
        assert_forward_matches(
            &cc,
            &format!("{level:?}"),
            &mut jit,
            ExportTarget::Host,
            &samples(3),
        );
    }
    let mut fast = Jit::builder()
        .fast_math(true)
        .tiering(Tiering::Off)
        .compile(&g)
        .unwrap();
    assert_forward_matches(&cc, "fast_math", &mut fast, ExportTarget::Host, &samples(3));

    // Eight copies of a 4-5-1 tanh network sharing its params, the loss their mean.
    let g = Graph::new();
    let w: Vec<Value> = (0..25)
        .map(|k| g.param(((k as f64) * 0.7).sin() * 0.4))
        .collect();
    let mut losses = Vec::new();
    for _ in 0..8 {
        let x = g.inputs(4);
        let hidden: Vec<Value> = (0..5)
            .map(|j| {
                (0..4)
                    .fold(w[20 + j], |acc, i| acc + w[j * 4 + i] * x[i])
                    .tanh()
            })
            .collect();
        let y = hidden.iter().fold(g.constant(0.0), |acc, &h| acc + h);
        losses.push((y - 0.5).powf(2.0));
    }
    let total = losses.iter().skip(1).fold(losses[0], |acc, &l| acc + l);
    g.set_loss(total * (1.0 / 8.0)).unwrap();
    let mut batch = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    assert!(!batch.stats().nests.is_empty(), "the plan nests the copies");
    let xs: Vec<f64> = (0..2 * 32).map(|i| ((i as f64) * 0.91).cos()).collect();
    assert_forward_matches(&cc, "copies", &mut batch, ExportTarget::Host, &xs);
}

/// Training by every optimizer, exported after two steps: the losses of `train` on some
/// samples and of a `step` after, and the params then, are the JIT's to the bit.
#[test]
fn exported_training_is_bit_identical() {
    let Some(cc) = c_compiler() else { return };
    let optimizers: [(&str, Optimizer); 4] = [
        ("sgd", Optimizer::default()),
        (
            "momentum",
            Sgd {
                momentum: 0.9,
                weight_decay: 0.01,
                nesterov: true,
                ..Sgd::default()
            }
            .into(),
        ),
        ("adam", Adam::default().into()),
        (
            "adamw",
            AdamW {
                weight_decay: 0.05,
                ..AdamW::default()
            }
            .into(),
        ),
    ];
    let xs = samples(6);
    for (name, optimizer) in optimizers {
        let mut jit = compiled(optimizer);
        // (Exported mid-training: the C side goes on from the optimizer's state.)
        jit.train(&xs[6..12], 0.05).unwrap();
        assert_training_matches(&cc, name, &mut jit, &xs, 0.05);
    }
}

/// `jit` exported for training (params in a buffer, set to its params), then `train` on
/// all of `xs` but the last sample and a `step` on that one, in C and in the JIT: the
/// losses and the params after, bit for bit.
fn assert_training_matches(cc: &str, name: &str, jit: &mut Jit, xs: &[f64], lr: f64) {
    let width = jit.tape().num_inputs();
    let n = xs.len() / width;
    let start = jit.params();
    let dir = scratch(name);
    let options = ExportOptions::new("t").training(true);
    jit.export(dir.join("t.o"), &options).unwrap();
    let last = (n - 1) * width;
    let mut expected = jit.train(&xs[..last], lr).unwrap();
    expected.push(jit.step(&xs[last..], lr).unwrap());
    expected.extend(jit.params());
    let main = format!(
        r#"{PRELUDE}
#include "t.h"
static const uint64_t X[] = {{ {} }};
static const uint64_t P[] = {{ {} }};
int main(void) {{
    double *ws = aligned_alloc(64, ((T_WORKSPACE_DOUBLES * 8 + 63) / 64) * 64);
    double x[{n} * T_NUM_INPUTS], p[T_NUM_PARAMS], losses[{n}];
    for (int i = 0; i < {n} * T_NUM_INPUTS; i++) x[i] = from_bits(X[i]);
    for (int i = 0; i < T_NUM_PARAMS; i++) p[i] = from_bits(P[i]);
    t_init(ws);
    t_set_params(ws, p);
    t_train(ws, x, {n} - 1, {lr:?}, losses);
    for (int i = 0; i < {n} - 1; i++) print(losses[i]);
    print(t_step(ws, x + ({n} - 1) * T_NUM_INPUTS, {lr:?}));
    t_get_params(ws, p);
    for (int i = 0; i < T_NUM_PARAMS; i++) print(p[i]);
    return 0;
}}"#,
        bits(xs),
        bits(&start)
    );
    let got = run_c(cc, &dir, &["t.o"], &main);
    assert_same_bits(name, &got, &expected);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A classifier whose layers the JIT lays out in rows with gaps between them, so that its
/// params are moved through a table of addresses: trained in C as by the JIT, bit for bit.
#[test]
fn exported_classifier_with_laid_out_rows_trains_alike() {
    let Some(cc) = c_compiler() else { return };
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(7);
    Classifier::new(&g, 30, &[6], 3, &mut rng).unwrap();
    let mut jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    assert!(jit.stats().moved_params > 0, "the layout moves the weights");
    let xs: Vec<f64> = (0..4 * 33)
        .map(|i| match i % 33 {
            30.. => ((i % 33 == 30 + (i / 33) % 3) as u8) as f64,
            _ => ((i as f64) * 0.37).sin().abs(),
        })
        .collect();
    assert_training_matches(&cc, "classifier", &mut jit, &xs, 0.1);
}

/// Two models under two prefixes link into one binary, each computing its own numbers.
#[test]
fn two_exported_models_link_together() {
    let Some(cc) = c_compiler() else { return };
    let dir = scratch("two");
    let mut first = compiled(Optimizer::default());
    let g = Graph::new();
    let x = g.input();
    let w = g.param(0.5);
    g.add_output((w * x).exp()).unwrap();
    let mut second = Jit::compile(&g).unwrap();
    first
        .export(dir.join("a.o"), &ExportOptions::new("a"))
        .unwrap();
    second
        .export(dir.join("b.o"), &ExportOptions::new("b"))
        .unwrap();
    first.set_inputs(&[0.1, 0.2, 0.3]).unwrap();
    let mut expected = vec![first.forward()];
    second.set_inputs(&[0.7]).unwrap();
    second.forward();
    expected.extend(second.outputs());
    let main = format!(
        r#"{PRELUDE}
#include "a.h"
#include "b.h"
int main(void) {{
    static double wa[A_WORKSPACE_DOUBLES], wb[B_WORKSPACE_DOUBLES];
    double xa[3] = {{0.1, 0.2, 0.3}}, oa[A_NUM_OUTPUTS], xb[1] = {{0.7}}, ob[1];
    a_init(wa);
    b_init(wb);
    print(a_forward(wa, xa, oa));
    b_forward(wb, xb, ob);
    print(ob[0]);
    return 0;
}}"#
    );
    let got = run_c(&cc, &dir, &["a.o", "b.o"], &main);
    assert_same_bits("two models", &got, &expected);
    let _ = std::fs::remove_dir_all(&dir);
}

fn export_error(jit: &Jit, path: &Path, options: &ExportOptions) -> String {
    match jit.export(path, options) {
        Err(Error::Export { problem }) => problem,
        other => panic!("expected Error::Export, got {other:?}"),
    }
}

#[test]
fn bad_exports_are_typed_errors() {
    let dir = scratch("errors");
    let jit = compiled(Optimizer::default());
    let path = dir.join("m.o");
    let problem = export_error(&jit, &path, &ExportOptions::new("2fast"));
    assert!(problem.contains("not a C identifier"), "{problem}");
    let problem = export_error(&jit, &dir.join("missing/m.o"), &ExportOptions::new("m"));
    assert!(problem.contains("cannot write"), "{problem}");
    let problem = export_error(&jit, &dir.join("m.h"), &ExportOptions::new("m"));
    assert!(problem.contains("where the header goes"), "{problem}");
    let frozen = ExportOptions::new("m")
        .training(true)
        .params(ExportParams::Frozen);
    let problem = export_error(&jit, &path, &frozen);
    assert!(problem.contains("frozen"), "{problem}");
    let lacking = ExportTarget::Named {
        triple: "nonesuch-unknown-none".into(),
        cpu: "generic".into(),
    };
    let problem = export_error(&jit, &path, &ExportOptions::new("m").target(lacking));
    assert!(problem.contains("no target"), "{problem}");
    // (LLVM would only warn of a CPU it lacks, then end the process in code generation.)
    for triple in ["x86_64-unknown-linux-gnu", "riscv64-unknown-linux-gnu"] {
        let unknown_cpu = ExportTarget::Named {
            triple: triple.into(),
            cpu: "nonesuchcpu".into(),
        };
        let options = ExportOptions::new("m").target(unknown_cpu);
        let problem = export_error(&jit, &path, &options);
        assert!(problem.contains("CPU named \"nonesuchcpu\""), "{problem}");
    }

    // A failed export leaves what the paths held as it was, and creates nothing.
    let (object, header) = (dir.join("kept.o"), dir.join("kept.h"));
    jit.export(&object, &ExportOptions::new("m")).unwrap();
    let before = (
        std::fs::read(&object).unwrap(),
        std::fs::read(&header).unwrap(),
    );
    assert!(!before.0.is_empty() && !before.1.is_empty());
    let unknown_cpu = ExportTarget::Named {
        triple: "x86_64-unknown-linux-gnu".into(),
        cpu: "nonesuchcpu".into(),
    };
    let options = ExportOptions::new("m").target(unknown_cpu);
    export_error(&jit, &object, &options);
    let after = (
        std::fs::read(&object).unwrap(),
        std::fs::read(&header).unwrap(),
    );
    assert!(
        after == before,
        "a failed export changed the files it would have replaced"
    );
    let fresh = dir.join("fresh.o");
    export_error(&jit, &fresh, &options);
    assert!(!fresh.exists() && !fresh.with_extension("h").exists());
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.to_string_lossy().contains(".partial-")),
        "{names:?}"
    );

    // Training a program without params, or without a loss.
    let g = Graph::new();
    let x = g.input();
    g.set_loss(x.exp()).unwrap();
    let no_params = Jit::compile(&g).unwrap();
    let problem = export_error(&no_params, &path, &ExportOptions::new("m").training(true));
    assert!(problem.contains("without params"), "{problem}");
    let g = Graph::new();
    let w = g.param(1.0);
    g.add_output(w.exp()).unwrap();
    let no_loss = Jit::compile(&g).unwrap();
    let problem = export_error(&no_loss, &path, &ExportOptions::new("m").training(true));
    assert!(problem.contains("without a loss"), "{problem}");
    let _ = std::fs::remove_dir_all(&dir);
}
