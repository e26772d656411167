//! `TAPEJIT_PERF_MAP`: every compiled function listed where `perf` looks for JIT symbols.
//! (Its own test binary: the variable is set for the whole process.)

use tapejit::{Graph, Jit, Program, Tiering};

#[cfg(target_os = "linux")]
#[test]
fn the_perf_map_names_every_compiled_function() {
    std::env::set_var("TAPEJIT_PERF_MAP", "1");
    let g = Graph::new();
    let x = g.inputs(3);
    let w = [g.param(0.5), g.param(-0.25), g.param(2.0)];
    let terms: Vec<_> = x.iter().zip(&w).map(|(&x, &w)| (x * w).tanh()).collect();
    g.set_loss(g.sum(&terms)).unwrap();
    let mut jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    jit.step(&[1.0, 2.0, 3.0], 0.1).unwrap();

    let path = format!("/tmp/perf-{}.map", std::process::id());
    let map = std::fs::read_to_string(&path).unwrap();
    let mut names = Vec::new();
    for line in map.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "{line}");
        let start = u64::from_str_radix(fields[0], 16).unwrap();
        let size = u64::from_str_radix(fields[1], 16).unwrap();
        assert!(start > 0 && size > 0, "{line}");
        names.push(fields[2]);
    }
    for entry in ["forward", "backward", "update", "step", "materialize"] {
        assert!(names.contains(&entry), "{entry} missing from {names:?}");
    }
    let _ = std::fs::remove_file(path);
}
