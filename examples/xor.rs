//! micrograd's XOR demo on tapejit: MLP(2, [4, 1]), squared error, full-batch gradient descent
//! (the 4 samples' gradients summed per epoch), 1000 epochs, lr 0.1.
//!
//! cargo run --release --example xor -- [--opt O0|O1|O2|O3|interp] [--seed S]

use rand::{rngs::StdRng, SeedableRng};
use tapejit::nn::MLP;
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program};

const SAMPLES: [([f64; 2], f64); 4] = [
    ([0.0, 0.0], 0.0),
    ([0.0, 1.0], 1.0),
    ([1.0, 0.0], 1.0),
    ([1.0, 1.0], 0.0),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let opt = arg("--opt").unwrap_or_else(|| "O2".into());
    let seed: u64 = arg("--seed").map_or(Ok(0), |s| s.parse())?;

    let g = Graph::new();
    let x = g.inputs(2);
    let y = g.input();
    let mut rng = StdRng::seed_from_u64(seed);
    let model = MLP::new(&g, 2, &[4, 1], &mut rng);
    let out = model.call(&x)?[0];
    g.add_output(out)?;
    g.set_loss((out - y).powf(2.0))?;

    let mut program: Box<dyn Program> = match opt.as_str() {
        "interp" => Box::new(Interpreter::new(&g)?),
        level => {
            let level = match level {
                "O0" => OptLevel::O0,
                "O1" => OptLevel::O1,
                "O2" => OptLevel::O2,
                "O3" => OptLevel::O3,
                other => return Err(format!("--opt {other}: expected O0..O3 or interp").into()),
            };
            Box::new(Jit::builder().opt_level(level).compile(&g)?)
        }
    };
    println!(
        "xor: MLP(2, [4, 1]) relu, {} params, backend {opt}",
        model.params().len()
    );

    let mut loss = 0.0;
    for epoch in 0..1000 {
        program.zero_grad();
        loss = 0.0;
        for (input, target) in SAMPLES {
            program.set_inputs(&[input[0], input[1], target])?;
            loss += program.forward();
            program.backward()?;
        }
        program.update(0.1)?;
        if epoch % 100 == 0 || epoch == 999 {
            println!("epoch {epoch:4}  loss {loss:.6}");
        }
    }
    for (input, target) in SAMPLES {
        program.set_inputs(&[input[0], input[1], target])?;
        program.forward();
        println!("{input:?} -> {:.4} (target {target})", program.outputs()[0]);
    }
    if loss < 0.05 {
        println!("converged: final loss {loss:.6}");
        Ok(())
    } else {
        Err(format!("did not converge: final loss {loss:.6}").into())
    }
}
