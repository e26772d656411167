//! End to end on small generated IDX data: train a classifier, save and load its params.

use rand::{rngs::StdRng, Rng, SeedableRng};
use tapejit::checkpoint::Checkpoint;
use tapejit::nn::Classifier;
use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program};
use tapejit_mnist::{self as mnist, Dataset, Images, Labels};

const SIDE: usize = 8;
const CLASSES: usize = 3;

/// Digit-like 8x8 images of three classes (a horizontal bar, a vertical bar, a diagonal) at
/// random positions, with noise.
fn synthetic(count: usize, seed: u64) -> (Images, Labels) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pixels = Vec::with_capacity(count * SIDE * SIDE);
    let mut labels = Vec::with_capacity(count);
    for _ in 0..count {
        let class = rng.gen_range(0..CLASSES);
        let at = rng.gen_range(1..SIDE - 1);
        for r in 0..SIDE {
            for c in 0..SIDE {
                let on = match class {
                    0 => r == at,
                    1 => c == at,
                    _ => r == c,
                };
                let noise: u8 = rng.gen_range(0..60);
                pixels.push(if on { 255 - noise } else { noise });
            }
        }
        labels.push(class as u8);
    }
    let images = Images {
        count,
        rows: SIDE,
        cols: SIDE,
        pixels,
    };
    (images, Labels { labels })
}

/// Writes a data set as IDX files and reads it back through the public loader.
fn dataset_via_files(name: &str, count: usize, seed: u64) -> Dataset {
    let dir = std::env::temp_dir().join(format!("tapejit-e2e-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (images, labels) = synthetic(count, seed);
    let (ip, lp) = (dir.join("images"), dir.join("labels"));
    mnist::write_images(std::fs::File::create(&ip).unwrap(), &images).unwrap();
    mnist::write_labels(std::fs::File::create(&lp).unwrap(), &labels).unwrap();
    let data = mnist::load_dataset(&ip, &lp).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    data
}

/// Example `i` in the classifier's input layout: the pixels scaled to [0, 1], then the label
/// one-hot over the classes.
fn fill_inputs(data: &Dataset, i: usize, inputs: &mut [f64]) {
    let (pixels, one_hot) = inputs.split_at_mut(data.images.pixels_per_image());
    mnist::write_normalized(data.pixels(i), pixels).unwrap();
    mnist::write_one_hot(data.label(i), one_hot).unwrap();
}

fn accuracy(program: &mut dyn Program, data: &Dataset) -> f64 {
    let mut inputs = vec![0.0; data.images.pixels_per_image() + CLASSES];
    let mut correct = 0;
    for i in 0..data.images.len() {
        fill_inputs(data, i, &mut inputs);
        program.set_inputs(&inputs).unwrap();
        program.forward();
        let out = program.outputs();
        let guess = (0..CLASSES).fold(0, |b, k| if out[k] > out[b] { k } else { b });
        correct += (guess == data.label(i) as usize) as usize;
    }
    correct as f64 / data.images.len() as f64
}

fn train_epoch(program: &mut dyn Program, data: &Dataset) {
    let mut inputs = vec![0.0; data.images.pixels_per_image() + CLASSES];
    for i in 0..data.images.len() {
        fill_inputs(data, i, &mut inputs);
        program.step(&inputs, 0.05).unwrap();
    }
}

#[test]
fn accuracy_rises_from_chance_identically_on_jit_and_interpreter() {
    let train = dataset_via_files("train", 300, 1);
    let test = dataset_via_files("test", 150, 2);
    let g = Graph::new();
    Classifier::new(
        &g,
        SIDE * SIDE,
        &[8],
        CLASSES,
        &mut StdRng::seed_from_u64(7),
    )
    .unwrap();
    let mut interp = Interpreter::new(&g).unwrap();
    let mut jit = Jit::builder().opt_level(OptLevel::O1).compile(&g).unwrap();
    let before = accuracy(&mut interp, &test);
    assert!(
        before < 0.7,
        "untrained accuracy {before} should be near chance"
    );
    for _ in 0..4 {
        train_epoch(&mut interp, &train);
        train_epoch(&mut jit, &train);
    }
    let after = accuracy(&mut interp, &test);
    assert!(after > 0.9, "accuracy after training {after}");
    assert_eq!(accuracy(&mut jit, &test), after);
    let bits = |p: &[f64]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&jit.params()), bits(&interp.params()));
}

#[test]
fn saved_params_reproduce_outputs_exactly() {
    let data = dataset_via_files("save", 50, 3);
    let g = Graph::new();
    Classifier::new(
        &g,
        SIDE * SIDE,
        &[5],
        CLASSES,
        &mut StdRng::seed_from_u64(1),
    )
    .unwrap();
    let mut trained = Jit::builder().opt_level(OptLevel::O0).compile(&g).unwrap();
    train_epoch(&mut trained, &data);

    let path = std::env::temp_dir().join(format!("tapejit-params-{}", std::process::id()));
    let architecture = [SIDE * SIDE, 5, CLASSES];
    Checkpoint::of(&trained, &architecture).save(&path).unwrap();

    // A fresh program of the same architecture, with other initial params, then loaded.
    let g2 = Graph::new();
    Classifier::new(
        &g2,
        SIDE * SIDE,
        &[5],
        CLASSES,
        &mut StdRng::seed_from_u64(99),
    )
    .unwrap();
    let mut loaded = Interpreter::new(&g2).unwrap();
    loaded
        .set_params(&Checkpoint::load_for(&path, &architecture, g2.num_params()).unwrap())
        .unwrap();
    let mut inputs = vec![0.0; SIDE * SIDE + CLASSES];
    for i in 0..data.images.len() {
        fill_inputs(&data, i, &mut inputs);
        for p in [&mut trained as &mut dyn Program, &mut loaded] {
            p.set_inputs(&inputs).unwrap();
            p.forward();
        }
        assert_eq!(trained.outputs(), loaded.outputs());
    }

    let wrong =
        Checkpoint::load_for(&path, &[SIDE * SIDE, 6, CLASSES], g2.num_params()).unwrap_err();
    assert!(
        matches!(&wrong, Error::Checkpoint { problem, .. } if problem.contains("64-5-3") && problem.contains("64-6-3")),
        "{wrong}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn corrupt_params_files_are_typed_errors() {
    let good = Checkpoint {
        architecture: vec![2, 3],
        params: vec![1.0, -2.5, 3.25],
        optimizer: None,
    }
    .to_bytes()
    .unwrap();
    assert_eq!(
        Checkpoint::from_bytes(&good, "p").unwrap().params,
        [1.0, -2.5, 3.25]
    );
    for len in 0..good.len() {
        let e = Checkpoint::from_bytes(&good[..len], "p").unwrap_err();
        assert!(matches!(e, Error::Checkpoint { .. }), "prefix {len}: {e:?}");
    }
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x5a;
        let e = Checkpoint::from_bytes(&bad, "p").unwrap_err();
        assert!(matches!(e, Error::Checkpoint { .. }), "flip {i}: {e:?}");
    }
    let missing = Checkpoint::load("/nonexistent/params").unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/params"),
        "{missing}"
    );
}
