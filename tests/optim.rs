//! Optimizers against `torch.optim`: a 3-4-1 tanh MLP trained full-batch for 100 steps by
//! SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW, every loss and the
//! final params and state within 1e-12 (relative) of PyTorch's, whose trajectories
//! `tests/data/make_optim_reference.py` computed once (torch is not needed here). Every
//! backend and every way of training (`step`, `train`, `train_minibatches` on 1 and 2
//! threads) gives the same bits; the state survives a checkpoint.

use serde_json::Value as Json;
use tapejit::checkpoint::Checkpoint;
use tapejit::optim::{Adam, AdamW, Optimizer, Sgd, State};
use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program};

const REFERENCE: &str = include_str!("data/optim_reference.json");
const STEPS: usize = 100;

fn numbers(j: &Json) -> Vec<f64> {
    j.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

/// The reference's model as a graph: its inputs are the 8 samples' features and targets
/// (one "sample" of 32 numbers, the whole batch), its params the MLP's in creation order.
fn model(reference: &Json) -> (Graph, Vec<f64>) {
    let m = &reference["model"];
    let init = numbers(&m["init"]);
    let xs: Vec<Vec<f64>> = m["x"].as_array().unwrap().iter().map(numbers).collect();
    let ys = numbers(&m["y"]);
    let g = Graph::new();
    let mut init = init.into_iter();
    let mut param = || g.param(init.next().unwrap());
    let hidden: Vec<(Vec<_>, _)> = (0..4)
        .map(|_| ((0..3).map(|_| param()).collect(), param()))
        .collect();
    let (out_w, out_b): (Vec<_>, _) = ((0..4).map(|_| param()).collect(), param());
    let mut inputs = Vec::new();
    let mut errors = Vec::new();
    for (x, y) in xs.iter().zip(&ys) {
        let xv = g.inputs_without_grad(3);
        let yv = g.input_without_grad();
        inputs.extend(x);
        inputs.push(*y);
        let h: Vec<_> = hidden
            .iter()
            .map(|(w, b)| {
                let terms = w.iter().zip(&xv).map(|(&w, &x)| w * x);
                g.sum(terms.chain([*b])).tanh()
            })
            .collect();
        let terms = out_w.iter().zip(&h).map(|(&v, &h)| v * h);
        let out = g.sum(terms.chain([out_b]));
        errors.push((out - yv).powf(2.0));
    }
    g.set_loss(g.sum(&errors) * 0.125).unwrap();
    (g, inputs)
}

fn optimizer(run: &Json) -> Optimizer {
    let o = &run["options"];
    let f = |k: &str| o[k].as_f64().unwrap_or(0.0);
    let betas = || {
        let b = numbers(&o["betas"]);
        (b[0], b[1])
    };
    match run["optimizer"].as_str().unwrap() {
        "SGD" => Sgd {
            momentum: f("momentum"),
            dampening: f("dampening"),
            nesterov: o["nesterov"].as_bool().unwrap_or(false),
            weight_decay: f("weight_decay"),
        }
        .into(),
        "Adam" => Adam {
            betas: betas(),
            eps: f("eps"),
            weight_decay: f("weight_decay"),
        }
        .into(),
        "AdamW" => AdamW {
            betas: betas(),
            eps: f("eps"),
            weight_decay: f("weight_decay"),
        }
        .into(),
        other => panic!("unknown optimizer {other}"),
    }
}

/// The rate of each step: the run's schedule, or its constant `lr`.
fn rates(run: &Json) -> Vec<f64> {
    match run.get("lrs") {
        Some(lrs) => numbers(lrs),
        None => vec![run["options"]["lr"].as_f64().unwrap(); STEPS],
    }
}

/// Within 1e-12 of torch's `want`, relative to each number (or, `whole`, to the largest: a
/// moment that cancels down to 1e-5 of the gradients it averages keeps their absolute
/// error).
fn assert_close(what: &str, got: &[f64], want: &[f64], whole: bool) {
    assert_eq!(got.len(), want.len(), "{what}");
    let largest = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let scale = if whole { largest } else { w.abs() };
        let diff = (g - w).abs() / scale.max(1e-300);
        assert!(diff < 1e-12, "{what}[{k}]: {g} vs torch {w} ({diff:e})");
    }
}

fn bits(xs: &[f64]) -> Vec<u64> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// What a trained program ends with: its losses, params and optimizer state.
type Trained = (Vec<f64>, Vec<f64>, State);

fn trained(p: &dyn Program, losses: Vec<f64>) -> Trained {
    (losses, p.params(), p.optimizer_state())
}

fn assert_same_bits(what: &str, got: &Trained, want: &Trained) {
    assert_eq!(bits(&got.0), bits(&want.0), "{what}: losses");
    assert_eq!(bits(&got.1), bits(&want.1), "{what}: params");
    assert_eq!(got.2.steps, want.2.steps, "{what}: steps");
    for ((name, g), (_, w)) in got.2.buffers.iter().zip(&want.2.buffers) {
        assert_eq!(bits(g), bits(w), "{what}: {name}");
    }
}

/// Every run of the reference, by `step` on the interpreter: within 1e-12 of torch.
#[test]
fn optimizers_follow_torch_optim() {
    let reference: Json = serde_json::from_str(REFERENCE).unwrap();
    let (g, inputs) = model(&reference);
    for run in reference["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap();
        let mut p = Interpreter::new(&g).unwrap();
        p.set_optimizer(optimizer(run)).unwrap();
        let losses: Vec<f64> = rates(run)
            .into_iter()
            .map(|lr| p.step(&inputs, lr).unwrap())
            .collect();
        assert_close(
            &format!("{name} losses"),
            &losses,
            &numbers(&run["losses"]),
            false,
        );
        assert_close(
            &format!("{name} params"),
            &p.params(),
            &numbers(&run["params"]),
            false,
        );
        let state = p.optimizer_state();
        let counted = !p.optimizer().is_plain();
        assert_eq!(
            state.steps,
            if counted { STEPS as u64 } else { 0 },
            "{name}"
        );
        for (buffer, xs) in &state.buffers {
            assert_close(
                &format!("{name} {buffer}"),
                xs,
                &numbers(&run["state"][buffer]),
                true,
            );
        }
        if let Some(step) = run["state"].get("step") {
            assert_eq!(step.as_f64(), Some(STEPS as f64), "{name}");
        }
    }
}

/// The JIT at every level, and `train` and `train_minibatches` (one sample a minibatch: the
/// mean gradient is the gradient) on 1 and 2 threads, give the interpreter's `step`'s bits.
#[test]
fn optimizers_give_the_same_bits_on_every_backend_and_path() {
    let reference: Json = serde_json::from_str(REFERENCE).unwrap();
    let (g, inputs) = model(&reference);
    let epoch: Vec<f64> = (0..STEPS).flat_map(|_| inputs.iter().copied()).collect();
    for run in reference["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap();
        let (opt, lrs) = (optimizer(run), rates(run));
        let mut interp = Interpreter::new(&g).unwrap();
        interp.set_optimizer(opt).unwrap();
        let losses = lrs
            .iter()
            .map(|&lr| interp.step(&inputs, lr).unwrap())
            .collect();
        let want = trained(&interp, losses);
        for level in OptLevel::ALL {
            let mut jit = Jit::builder()
                .opt_level(level)
                .optimizer(opt)
                .compile(&g)
                .unwrap();
            let losses = lrs
                .iter()
                .map(|&lr| jit.step(&inputs, lr).unwrap())
                .collect();
            assert_same_bits(
                &format!("{name} JIT {level}"),
                &trained(&jit, losses),
                &want,
            );
        }
        if run.get("lrs").is_some() {
            continue; // train and train_minibatches take one rate
        }
        let lr = lrs[0];
        let mut programs: Vec<Box<dyn Program>> = vec![
            Box::new(Interpreter::new(&g).unwrap()),
            Box::new(Jit::compile(&g).unwrap()),
        ];
        for p in &mut programs {
            p.set_optimizer(opt).unwrap();
            let losses = p.train(&epoch, lr).unwrap();
            assert_same_bits(
                &format!("{name} train"),
                &trained(p.as_ref(), losses),
                &want,
            );
            for threads in [1, 2] {
                p.set_optimizer(opt).unwrap();
                p.set_params(&numbers(&reference["model"]["init"])).unwrap();
                let losses = p.train_minibatches(&epoch, 1, lr, threads).unwrap();
                let got = trained(p.as_ref(), losses);
                assert_same_bits(&format!("{name} minibatches on {threads}"), &got, &want);
            }
        }
    }
}

/// An optimizer's state is the program's: read, written back into a fresh program, it
/// continues where the first left off, bit for bit; a state of other buffers or length is
/// refused, as are hyperparameters PyTorch refuses.
#[test]
fn optimizer_state_moves_between_programs_and_bad_input_is_refused() {
    let reference: Json = serde_json::from_str(REFERENCE).unwrap();
    let (g, inputs) = model(&reference);
    let adam: Optimizer = Adam::default().into();
    let mut straight = Jit::builder().optimizer(adam).compile(&g).unwrap();
    let mut first = Interpreter::new(&g).unwrap();
    first.set_optimizer(adam).unwrap();
    for _ in 0..10 {
        straight.step(&inputs, 0.01).unwrap();
        first.step(&inputs, 0.01).unwrap();
    }
    // Through a checkpoint file: params, moments and step count.
    let path = std::env::temp_dir().join(format!("tapejit-adam-{}", std::process::id()));
    Checkpoint::of(&first, &[3, 4, 1]).save(&path).unwrap();
    let file = path.display().to_string();
    let loaded = Checkpoint::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.optimizer.as_ref().unwrap().state.steps, 10);
    let mut plain = Interpreter::new(&g).unwrap();
    let e = loaded.restore(&mut plain, &file).unwrap_err();
    assert!(e.to_string().contains("optimizer adam"), "{e}");
    let mut second = Jit::builder().optimizer(adam).compile(&g).unwrap();
    let e = Checkpoint::of(&plain, &[3, 4, 1]).restore(&mut second, &file);
    assert!(e.unwrap_err().to_string().contains("no optimizer state"));
    loaded.restore(&mut second, &file).unwrap();
    assert_eq!(second.optimizer_state(), first.optimizer_state());
    for _ in 0..10 {
        straight.step(&inputs, 0.01).unwrap();
        second.step(&inputs, 0.01).unwrap();
    }
    assert_eq!(bits(&second.params()), bits(&straight.params()));

    let mut state = second.optimizer_state();
    state.buffers[0].1.pop();
    let before = second.optimizer_state();
    assert!(matches!(
        second.set_optimizer_state(&state),
        Err(Error::Optimizer { .. })
    ));
    state.buffers.truncate(1);
    assert!(second.set_optimizer_state(&state).is_err());
    assert_eq!(second.optimizer_state(), before);

    for bad in [
        Optimizer::from(Adam {
            betas: (1.0, 0.999),
            ..Adam::default()
        }),
        AdamW {
            eps: -1.0,
            ..AdamW::default()
        }
        .into(),
        Sgd {
            nesterov: true,
            ..Sgd::default()
        }
        .into(),
        Sgd {
            momentum: f64::NAN,
            ..Sgd::default()
        }
        .into(),
    ] {
        let e = second.set_optimizer(bad).unwrap_err();
        assert!(matches!(e, Error::Optimizer { .. }), "{e}");
        assert_eq!(second.optimizer(), adam);
        let e = Jit::builder().optimizer(bad).compile(&g).err();
        assert!(matches!(e, Some(Error::Optimizer { .. })), "{e:?}");
    }
}
