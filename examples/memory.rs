//! What a live `Jit` keeps resident: tests/large.rs's chain of `--nodes` nodes, compiled at
//! `--level` straight-line (`--loops`: with loop recovery, which rolls the chain's repeated
//! pattern), against its machine code and buffers.
//!
//! cargo run --release --example memory -- [--nodes 1000000] [--level O0] [--loops] [--maps]
//!
//! Resident memory is the process's (`/proc/self/status`), read before and after compiling the
//! tape: the difference is what the `Jit` holds beyond the tape it owns. `VmRSS` counts all
//! of it, `RssAnon` only anonymous memory (heap, mappings, machine code), not the pages of the
//! executable (LLVM's own code) that compiling brought in; `VmHWM` is the process's peak,
//! reached while compiling. `--maps` lists the mappings with more than 1 MB resident while
//! the `Jit` is live.

#[path = "../tests/common/chain.rs"]
mod chain;
#[path = "common/status.rs"]
mod status;

use std::time::Instant;

use clap::Parser;

use tapejit::{Graph, Jit, OptLevel, Program, Tape, Tiering};

/// `(VmRSS, RssAnon)`.
fn resident() -> (u64, u64) {
    (
        status::field("VmRSS:") * 1024,
        status::field("RssAnon:") * 1024,
    )
}

/// The mappings with more than 1 MB resident (`/proc/self/smaps`): where the memory is.
fn print_large_mappings() {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut header = "";
    for line in smaps.lines() {
        if let Some(kb) = line.strip_prefix("Rss:") {
            let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            if kb > 1024 {
                println!("  {:>8.1} MB  {header}", kb as f64 / 1e3);
            }
        } else if is_mapping_header(line) {
            header = line;
        }
    }
}

/// Whether a line of `smaps` starts a mapping (`start-end perms offset dev inode [path]`)
/// rather than giving one of its fields (`Name: value`).
fn is_mapping_header(line: &str) -> bool {
    line.split_whitespace().next().is_some_and(|range| {
        range.contains('-') && range.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
    })
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// A chain of nodes compiled straight-line: resident memory before, after and at the peak.
#[derive(Parser)]
#[command(name = "memory")]
struct Options {
    /// Nodes in the chain
    #[arg(long, default_value_t = 1_000_000)]
    nodes: usize,
    /// The JIT's optimization level
    #[arg(long, default_value = "O0")]
    level: OptLevel,
    /// Recover loops (off: straight-line)
    #[arg(long)]
    loops: bool,
    /// Also print the large mappings of the process
    #[arg(long)]
    maps: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Options {
        nodes,
        level,
        loops,
        maps,
    } = Options::parse();

    let g = Graph::new();
    chain::build_chain(&g, nodes);
    let tape = Tape::from_graph(&g)?;
    let len = tape.len();
    let before = resident();
    let start = Instant::now();
    let mut jit = Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(level)
        .loop_recovery(loops)
        .compile_tape(tape)?;
    let secs = start.elapsed().as_secs_f64();
    let live = resident();
    let peak = status::field("VmHWM:") * 1024;
    jit.set_inputs(&[chain::X])?;
    let loss = jit.forward();
    jit.backward()?;
    let run = resident();
    let buffers = 2 * 8 * len as u64;
    let code = jit.stats().code_bytes as u64;
    let row = |what: &str, (rss, anon): (u64, u64)| {
        println!(
            "{what:<28} {:>10} {:>10}  (+{} / +{})",
            mb(rss),
            mb(anon),
            mb(rss.saturating_sub(before.0)),
            mb(anon.saturating_sub(before.1))
        );
    };
    println!("{len} nodes at {level}: compiled in {secs:.2} s, loss {loss}");
    println!("{:<28} {:>10} {:>10}", "", "VmRSS", "RssAnon");
    row("before compiling", before);
    row("with the live Jit", live);
    row("after forward and backward", run);
    println!("peak while compiling (VmHWM) {}", mb(peak));
    println!("machine code (code_bytes)    {}", mb(code));
    println!("buffers (2 x 8 B x tape)     {}", mb(buffers));
    println!(
        "live Jit (RssAnon) / (2 x code + buffers): {:.2}",
        live.1.saturating_sub(before.1) as f64 / (2 * code + buffers) as f64
    );
    println!("threads with the live Jit    {}", status::field("Threads:"));
    if maps {
        print_large_mappings();
    }
    drop(jit);
    row("after dropping the Jit", resident());
    Ok(())
}
