//! Compile time of one wide node: a single `sum` of `n` operands that loop recovery cannot
//! roll (inputs picked at random), at O2. The plan cuts the sum into parts across
//! functions, so compile time stays linear in the operand count.
//!
//! `cargo run --release --example wide_sum -- 50000 100000 200000`

use rand::{rngs::StdRng, Rng, SeedableRng};
use tapejit::{Graph, Jit, OptLevel};

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("operand counts"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![50_000, 100_000, 200_000]
    } else {
        sizes
    };
    println!("| operands | tape nodes | functions | IR s | optimize s | codegen s | compile s | s per 1k operands |");
    println!("|--:|--:|--:|--:|--:|--:|--:|--:|");
    for n in sizes {
        let g = Graph::new();
        let x = g.inputs(1000);
        let mut rng = StdRng::seed_from_u64(n as u64);
        let terms: Vec<_> = (0..n).map(|_| x[rng.gen_range(0..1000)]).collect();
        g.set_loss(g.sum(&terms)).unwrap();
        let jit = Jit::builder().opt_level(OptLevel::O2).compile(&g).unwrap();
        let stats = jit.stats();
        let secs = stats.total_secs();
        println!(
            "| {n} | {} | {} | {:.2} | {:.2} | {:.2} | {secs:.2} | {:.3} |",
            stats.tape_nodes,
            stats.functions,
            stats.ir_build_secs,
            stats.optimize_secs,
            stats.codegen_secs,
            secs / n as f64 * 1000.0
        );
    }
}
