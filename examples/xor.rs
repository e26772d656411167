//! micrograd's XOR demo on tapejit: MLP(2, [4, 1]), squared error, full-batch gradient descent
//! (the 4 samples' gradients summed per epoch), 1000 epochs, lr 0.1.
//!
//! cargo run --release --example xor -- [--opt O0|O1|O2|O3|interp] [--seed S]

use clap::Parser;
use rand::{rngs::StdRng, SeedableRng};
use tapejit::nn::MLP;
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program};

const SAMPLES: [([f64; 2], f64); 4] = [
    ([0.0, 0.0], 0.0),
    ([0.0, 1.0], 1.0),
    ([1.0, 0.0], 1.0),
    ([1.0, 1.0], 0.0),
];

/// micrograd's XOR demo: MLP(2, [4, 1]), squared error, 1000 epochs of full-batch descent.
#[derive(Parser)]
#[command(name = "xor")]
struct Options {
    /// The JIT at O0..O3, or the interpreter
    #[arg(long, default_value = "O2", value_parser = ["O0", "O1", "O2", "O3", "interp"])]
    opt: String,
    /// Seed of the initial params
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Options { opt, seed } = Options::parse();

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
        level => Box::new(
            Jit::builder()
                .opt_level(level.parse::<OptLevel>()?)
                .compile(&g)?,
        ),
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
