//! What a live `Jit` keeps resident: tests/large.rs's chain of `--nodes` nodes (straight-line
//! code: no loop to recover), compiled at `--level`, against its machine code and buffers.
//!
//! cargo run --release --example memory -- [--nodes 1000000] [--level O0]
//!
//! Resident memory is the process's (`VmRSS` in `/proc/self/status`), read before and after
//! compiling the tape: the difference is what the `Jit` holds beyond the tape it owns.

#[path = "../tests/common/chain.rs"]
mod chain;

use std::time::Instant;

use tapejit::{Graph, Jit, OptLevel, Program, Tape};

/// The process's resident memory in bytes (0 where `/proc` is missing).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let nodes: usize = opt("--nodes").map_or(Ok(1_000_000), |n| n.parse())?;
    let level = match opt("--level").as_deref().unwrap_or("O0") {
        "O0" => OptLevel::O0,
        "O1" => OptLevel::O1,
        "O2" => OptLevel::O2,
        "O3" => OptLevel::O3,
        other => return Err(format!("unknown level {other}; use O0..O3").into()),
    };

    let g = Graph::new();
    chain::build_chain(&g, nodes);
    let tape = Tape::from_graph(&g)?;
    let len = tape.len();
    let before = resident_bytes();
    let start = Instant::now();
    let mut jit = Jit::builder().opt_level(level).compile_tape(tape)?;
    let secs = start.elapsed().as_secs_f64();
    let live = resident_bytes();
    jit.set_inputs(&[chain::X])?;
    let loss = jit.forward();
    jit.backward()?;
    let after_run = resident_bytes();
    let buffers = 2 * 8 * len as u64;
    println!("{len} nodes at {level}: compiled in {secs:.2} s, loss {loss}");
    println!("resident before compiling:  {}", mb(before));
    println!(
        "resident with the live Jit: {} (+{})",
        mb(live),
        mb(live.saturating_sub(before))
    );
    println!(
        "after forward and backward: {} (+{})",
        mb(after_run),
        mb(after_run.saturating_sub(before))
    );
    println!("buffers (2 x 8 B x tape):   {}", mb(buffers));
    let code = jit.stats().code_bytes as u64;
    println!("machine code (code_bytes):  {}", mb(code));
    println!(
        "live Jit / (2 x code + buffers): {:.2}",
        live.saturating_sub(before) as f64 / (2 * code + buffers) as f64
    );
    drop(jit);
    println!("after dropping the Jit:     {}", mb(resident_bytes()));
    Ok(())
}
